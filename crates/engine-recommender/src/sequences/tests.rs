//! The sequence recommender's reading of its config: documented parameters, groups, lookups.

use super::*;

fn config(inputs: &[&str]) -> ModelConfig {
    let tensors: Vec<String> = inputs
        .iter()
        .map(|n| format!(r#"{{"name": "{n}", "data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": true}}"#))
        .collect();
    ModelConfig::from_json(&format!(
        r#"{{"name": "s", "max_batch_size": 8, "input": [{}], "output": [{{"name": "predictions", "data_type": "TYPE_FP32", "dims": [1]}}]}}"#,
        tensors.join(",")
    ))
    .unwrap()
}

#[test]
fn documented_row_for_row() {
    let doc = include_str!("../../../../docs/settings.md");
    triton_rust_core::settings::check_section(
        doc,
        "Sequence recommender engine",
        SequenceParams::KNOWN,
    )
    .unwrap();
}

#[test]
fn lengths_govern_their_group_and_the_rest_hold_one_value() {
    let c = config(&[
        "user_ids",
        "query_times",
        "hist_lengths",
        "hist_item_ids",
        "hist_actions",
        "cand_lengths",
        "cand_item_ids",
    ]);
    let e = groups(&config(&["a_lengths", "a_b_lengths", "a_b_ids"])).unwrap_err();
    assert!(e.message().contains("'a_b_ids' is counted by both"), "{e}");
    let e = groups(&config(&["a_lengths", "a_b_lengths"])).unwrap_err();
    assert!(e.message().contains("'a_b_lengths' is counted by both"), "{e}");
    let g = groups(&c).unwrap();
    assert_eq!(g.singles, ["user_ids", "query_times"]);
    assert_eq!(
        g.groups,
        [
            (
                "hist_lengths".to_string(),
                vec!["hist_item_ids".to_string(), "hist_actions".to_string()]
            ),
            ("cand_lengths".to_string(), vec!["cand_item_ids".to_string()]),
        ]
    );
}

#[test]
fn lookups_name_their_table_and_both_tensors() {
    let tables = TableSettings {
        names: vec!["item_id".into(), "user_id".into()],
        dims: vec![4],
        defaults: vec![0.0],
        files: vec![],
        vocabulary: vec![Some(10), None],
    };
    let c = config(&["user_ids", "hist_item_ids"]);
    let rows = |n: &str| TensorSpec { name: n.into(), dtype: DataType::F32, shape: vec![-1, 4] };
    let net =
        Signature { inputs: vec![rows("user_rows"), rows("hist_item_rows")], outputs: vec![] };
    let l = lookups("user:user_id, hist_item:item_id", &tables, &c, &net).unwrap();
    assert_eq!((l[0].table, l[0].vocabulary, l[1].table, l[1].vocabulary), (1, None, 0, Some(10)));
    let e = lookups("user:users", &tables, &c, &net).unwrap_err();
    assert!(e.message().contains("table 'users'"), "{e}");
    let e = lookups("cand_item:item_id", &tables, &c, &net).unwrap_err();
    assert!(e.message().contains("'cand_item_ids'"), "{e}");
    let e = lookups("user", &tables, &c, &net).unwrap_err();
    assert!(e.message().contains("<stem>:<table>"), "{e}");
}
