use super::*;

fn cfg(max_batch: i64) -> ModelConfig {
    ModelConfig::from_json(&format!(
        r#"{{"max_batch_size": {max_batch},
            "input": [{{"name": "A", "data_type": "TYPE_FP32", "dims": [-1]}},
                      {{"name": "B", "data_type": "TYPE_INT32", "dims": [2]}}],
            "output": [{{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}}]}}"#
    ))
    .unwrap()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn t<'a>(name: &str, dtype: DataType, shape: &[i64], chunks: Vec<&'a [u8]>) -> RequestTensor<'a> {
    RequestTensor {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        chunks: chunks.into_iter().map(Bytes::Host).collect(),
    }
}

#[test]
fn checks_name_the_problem() {
    let c = cfg(8);
    let p = InputPolicy { reject_nonfinite: true, ..Default::default() };
    let a = f32s(&[1.0, 2.0, 3.0]);
    let b = i32s(&[1, 2]);
    fn ok<'a>(a: &'a [u8], b: &'a [u8]) -> Vec<RequestTensor<'a>> {
        vec![t("A", DataType::F32, &[1, 3], vec![a]), t("B", DataType::I32, &[1, 2], vec![b])]
    }
    assert_eq!(check_request(&c, &p, ok(&a, &b)).unwrap().batch, 1);

    let err = |inputs| check_request(&c, &p, inputs).unwrap_err().to_string();
    assert!(err(vec![t("A", DataType::F32, &[1, 3], vec![&a])]).contains("missing input 'B'"));
    let mut extra = ok(&a, &b);
    extra.push(t("C", DataType::F32, &[1, 3], vec![&a]));
    assert!(err(extra).contains("unexpected input 'C'"));
    assert!(err(vec![
        t("A", DataType::F64, &[1, 3], vec![&a]),
        t("B", DataType::I32, &[1, 2], vec![&b])
    ])
    .contains("'A' has data type FP64"));
    assert!(err(vec![
        t("A", DataType::F32, &[1, 3], vec![&a]),
        t("B", DataType::I32, &[1, 3], vec![&b])
    ])
    .contains("'B' has shape [1, 3]"));
    assert!(err(vec![
        t("A", DataType::F32, &[1, 4], vec![&a]),
        t("B", DataType::I32, &[1, 2], vec![&b])
    ])
    .contains("holds 12 bytes"));
    // 2^62 FP32 elements are 2^64 bytes: wrapped, that is the 0 bytes sent
    assert!(err(vec![
        t("A", DataType::F32, &[1, 1 << 62], vec![]),
        t("B", DataType::I32, &[1, 2], vec![&b])
    ])
    .contains("'A' has shape [1, 4611686018427387904], too large"));
    assert!(err(vec![
        t("A", DataType::F32, &[1, 0], vec![]),
        t("B", DataType::I32, &[1, 2], vec![&b])
    ])
    .contains("'A' is empty"));
    let nan = f32s(&[1.0, f32::NAN, 3.0]);
    assert!(err(ok(&nan, &b)).contains("'A' holds a NaN or infinite value at element 1"));
    let b2 = i32s(&[1, 2, 3, 4]);
    assert!(err(vec![
        t("A", DataType::F32, &[1, 3], vec![&a]),
        t("B", DataType::I32, &[2, 2], vec![&b2])
    ])
    .contains("batch size 2 but input 'A' has 1"));
    let big = f32s(&[0.0; 9]);
    let bigb = i32s(&[0; 18]);
    assert!(err(vec![
        t("A", DataType::F32, &[9, 1], vec![&big]),
        t("B", DataType::I32, &[9, 2], vec![&bigb])
    ])
    .contains("above the model's max_batch_size 8"));
    // NaN allowed unless the policy forbids it
    assert!(check_request(&c, &InputPolicy::default(), ok(&nan, &b)).is_ok());
}

#[test]
fn reshape_gives_the_engine_the_models_shape_and_clients_the_configs() {
    // a scalar input and output, as auto-complete writes them: dims [1], reshape []
    let c = ModelConfig::from_json(
            r#"{"max_batch_size": 0,
            "input": [{"name": "sr", "data_type": "TYPE_INT64", "dims": [1], "reshape": {}}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}]}"#,
        )
        .unwrap();
    assert_eq!(c.inputs[0].reshape, Some(vec![]));
    let sr = 16000i64.to_le_bytes();
    let r =
        check_request(&c, &InputPolicy::default(), vec![t("sr", DataType::I64, &[1], vec![&sr])])
            .unwrap();
    let batch = assemble(&c, &[&r]).unwrap();
    assert_eq!(batch.tensors[0].shape, Vec::<i64>::new(), "the engine gets a rank-0 tensor");
    let parts = scatter_ranges(&c, &batch, "y", DataType::F32, &[], Bytes::Host(&[])).unwrap();
    assert_eq!(parts, vec![(vec![1], 0..4)], "the client gets dims [1] back");
    // batching: [batch, 1] on the wire, [batch] in the model
    let c = ModelConfig::from_json(
            r#"{"max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1], "reshape": {}}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2, 2], "reshape": {"shape": [4]}}]}"#,
        )
        .unwrap();
    let (a, b) = (f32s(&[1.0]), f32s(&[2.0, 3.0]));
    let r1 =
        check_request(&c, &InputPolicy::default(), vec![t("x", DataType::F32, &[1, 1], vec![&a])])
            .unwrap();
    let r2 =
        check_request(&c, &InputPolicy::default(), vec![t("x", DataType::F32, &[2, 1], vec![&b])])
            .unwrap();
    let batch = assemble(&c, &[&r1, &r2]).unwrap();
    assert_eq!(batch.tensors[0].shape, vec![3]);
    let parts = scatter_ranges(&c, &batch, "y", DataType::F32, &[3, 4], Bytes::Host(&[])).unwrap();
    assert_eq!(parts, vec![(vec![1, 2, 2], 0..16), (vec![2, 2, 2], 16..48)]);
    assert!(ModelConfig::from_json(r#"{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2], "reshape": {"shape": [3]}}]}"#).is_err());
}

#[test]
fn valid_range_refuses_ids_past_the_vocabulary() {
    let c = ModelConfig::from_json(r#"{"max_batch_size": 4, "input": [{"name": "ids", "data_type": "TYPE_INT32", "dims": [3]}]}"#).unwrap();
    let p = InputPolicy {
        valid_range: parse_valid_range("ids:0:30521").unwrap(),
        ..Default::default()
    };
    let ok = i32s(&[0, 101, 30521]);
    check_request(&c, &p, vec![t("ids", DataType::I32, &[1, 3], vec![&ok])]).unwrap();
    let bad = i32s(&[5, 30522, 7]);
    let e = check_request(&c, &p, vec![t("ids", DataType::I32, &[1, 3], vec![&bad])]).unwrap_err();
    assert_eq!(
        e.message(),
        "input 'ids' holds 30522 at element 1, outside the model's valid range [0, 30521]"
    );
    let neg = i32s(&[-1, 0, 0]);
    assert!(check_request(&c, &p, vec![t("ids", DataType::I32, &[1, 3], vec![&neg])]).is_err());
    assert_eq!(
        parse_valid_range(" a:0:9 , b:-3:3").unwrap(),
        vec![("a".into(), 0, 9), ("b".into(), -3, 3)]
    );
    assert!(
        parse_valid_range("a:9:0").is_err()
            && parse_valid_range("a:x:1").is_err()
            && parse_valid_range(":0:1").is_err()
    );
}

#[test]
fn shared_named_dims_must_agree() {
    let a = f32s(&[0.0; 16]);
    let b = f32s(&[0.0; 8]);
    let n: Vec<String> = vec!["batch".into(), "n".into()];
    let good =
        [t("X", DataType::F32, &[1, 16], vec![&a]), t("Y", DataType::F32, &[1, 16], vec![&a])];
    check_shared_dims(&good, &[("X", &n), ("Y", &n)]).unwrap();
    let bad = [t("X", DataType::F32, &[1, 16], vec![&a]), t("Y", DataType::F32, &[1, 8], vec![&b])];
    let e = check_shared_dims(&bad, &[("X", &n), ("Y", &n)]).unwrap_err();
    assert_eq!(e.message(), "inputs 'X' and 'Y' must agree on dimension 'n': 16 vs 8");
    // unnamed dims are free
    let free: Vec<String> = vec![String::new(), String::new()];
    check_shared_dims(&bad, &[("X", &free), ("Y", &free)]).unwrap();
    // ONNX Runtime's "?" is unnamed too, even when one input has several of them
    let q: Vec<String> = vec!["?".into(), "?".into()];
    check_shared_dims(&bad, &[("X", &q), ("Y", &q)]).unwrap();
    // a name repeated within one input (a square matrix) binds that input to itself
    let sq: Vec<String> = vec!["m".into(), "m".into()];
    let e = check_shared_dims(&bad, &[("X", &sq)]).unwrap_err();
    assert_eq!(
        e.message(),
        "input 'X' must have the same size in every dimension named 'm': 1 vs 16"
    );
}

#[test]
fn device_inputs_need_a_device_engine() {
    let c = cfg(8);
    let b = i32s(&[1, 2]);
    let on_gpu = f32s(&[1.0, 2.0, 3.0]);
    let dev = RequestTensor {
        name: "A".into(),
        dtype: DataType::F32,
        shape: vec![1, 3],
        chunks: vec![Bytes::Device(DeviceView::simulated(0, &on_gpu))],
    };
    let e = check_request(
        &c,
        &InputPolicy::default(),
        vec![dev.clone(), t("B", DataType::I32, &[1, 2], vec![&b])],
    )
    .unwrap_err();
    assert!(e.message().contains("GPU memory"), "{e}");
    let p = InputPolicy { accepts_device_inputs: true, ..Default::default() };
    let r = check_request(&c, &p, vec![dev, t("B", DataType::I32, &[1, 2], vec![&b])]).unwrap();
    let batch = assemble(&c, &[&r]).unwrap();
    assert!(
        matches!(batch.tensors[0].data, BatchData::Borrowed(Bytes::Device(_))),
        "used in place"
    );
}

#[test]
fn gpu_inputs_batch_together_as_device_parts() {
    let c = cfg(8);
    let p = InputPolicy { accepts_device_inputs: true, ..Default::default() };
    let b = i32s(&[1, 2]);
    let (g1, g2) = (f32s(&[1.0, 2.0, 3.0]), f32s(&[4.0, 5.0, 6.0]));
    let dev = |bytes| RequestTensor {
        name: "A".into(),
        dtype: DataType::F32,
        shape: vec![1, 3],
        chunks: vec![Bytes::Device(DeviceView::simulated(0, bytes))],
    };
    let r1 =
        check_request(&c, &p, vec![dev(&g1), t("B", DataType::I32, &[1, 2], vec![&b])]).unwrap();
    let r2 =
        check_request(&c, &p, vec![dev(&g2), t("B", DataType::I32, &[1, 2], vec![&b])]).unwrap();
    let a = f32s(&[1.0, 2.0, 3.0]);
    let host = check_request(
        &c,
        &p,
        vec![t("A", DataType::F32, &[1, 3], vec![&a]), t("B", DataType::I32, &[1, 2], vec![&b])],
    )
    .unwrap();
    let all = [&r1, &host, &r2];
    // GPU requests batch with each other, not with the host one
    assert_eq!(group_by_shape(&c, &all), vec![vec![0, 2], vec![1]]);
    let batch = assemble(&c, &[&r1, &r2]).unwrap();
    match &batch.tensors[0].data {
        BatchData::DeviceParts(parts) => {
            assert!(parts.iter().all(|v| v.device() == 0));
            assert_eq!(parts[0].simulated_bytes(), Some(&g1[..]));
            assert_eq!(parts[1].simulated_bytes(), Some(&g2[..]));
        }
        _ => panic!("expected device parts"),
    }
    assert!(
        matches!(batch.tensors[1].data, BatchData::Owned(_)),
        "the host input is concatenated as usual"
    );
    assert_eq!(batch.tensors[0].shape, vec![2, 3]);
}

#[test]
fn assembles_groups_and_scatters() {
    let c = cfg(8);
    let p = InputPolicy::default();
    let a1 = f32s(&[1.0, 2.0, 3.0]);
    let a2 = f32s(&[4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    let a2_lo = &a2[..12];
    let a2_hi = &a2[12..];
    let a3 = f32s(&[1.0, 2.0]);
    let b1 = i32s(&[1, 2]);
    let b2 = i32s(&[3, 4, 5, 6]);
    let b3 = i32s(&[7, 8]);
    let r1 = check_request(
        &c,
        &p,
        vec![t("A", DataType::F32, &[1, 3], vec![&a1]), t("B", DataType::I32, &[1, 2], vec![&b1])],
    )
    .unwrap();
    // r2's A arrives in two chunks
    let r2 = check_request(
        &c,
        &p,
        vec![
            t("B", DataType::I32, &[2, 2], vec![&b2]),
            t("A", DataType::F32, &[2, 3], vec![a2_lo, a2_hi]),
        ],
    )
    .unwrap();
    let r3 = check_request(
        &c,
        &p,
        vec![t("A", DataType::F32, &[1, 2], vec![&a3]), t("B", DataType::I32, &[1, 2], vec![&b3])],
    )
    .unwrap();
    let all = [&r1, &r2, &r3];
    let groups = group_by_shape(&c, &all);
    assert_eq!(groups, vec![vec![0, 1], vec![2]]);

    let g: Vec<&CheckedRequest> = groups[0].iter().map(|&i| all[i]).collect();
    let batch = assemble(&c, &g).unwrap();
    assert_eq!(batch.total_rows, 3);
    assert_eq!(batch.tensors[0].shape, vec![3, 3]);
    let mut want = a1.clone();
    want.extend(&a2);
    assert_eq!(batch.tensors[0].host_bytes().unwrap(), &want[..]);
    assert_eq!(batch.tensors[1].shape, vec![3, 2]);
    assert!(matches!(batch.tensors[0].data, BatchData::Owned(_)));

    // A single contiguous request is used in place.
    let single = assemble(&c, &[&r3]).unwrap();
    assert!(matches!(single.tensors[0].data, BatchData::Borrowed(_)));
    assert_eq!(single.tensors[0].host_bytes().unwrap().as_ptr(), a3.as_ptr());

    let parts = scatter_ranges(&c, &batch, "Y", DataType::F32, &[3, 5], Bytes::Host(&[])).unwrap();
    assert_eq!(parts, vec![(vec![1, 5], 0..20), (vec![2, 5], 20..60)]);
    let e = scatter_ranges(&c, &batch, "Y", DataType::F32, &[2, 5], Bytes::Host(&[])).unwrap_err();
    assert!(e.message().contains("'Y'"), "{e}");
}

#[test]
fn strings_are_checked_batched_and_scattered_by_element() {
    use crate::tensor::encode_strings;
    let c = ModelConfig::from_json(
            r#"{"max_batch_size": 8,
            "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": "label", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}]}"#,
        )
        .unwrap();
    let p = InputPolicy::default();
    let one = encode_strings(&["a"]).unwrap();
    let two = encode_strings(&["bb", "ccc"]).unwrap();
    let r1 = check_request(&c, &p, vec![t("text", DataType::Bytes, &[1, 1], vec![&one])]).unwrap();
    // a request's strings may arrive in pieces that split an element
    let r2 = check_request(
        &c,
        &p,
        vec![t("text", DataType::Bytes, &[2, 1], vec![&two[..5], &two[5..]])],
    )
    .unwrap();
    let batch = assemble(&c, &[&r1, &r2]).unwrap();
    let mut joined = one.clone();
    joined.extend(&two);
    assert_eq!(batch.tensors[0].host_bytes().unwrap(), &joined[..]);
    let out = encode_strings(&["x", "yy", "zzz"]).unwrap();
    let parts =
        scatter_ranges(&c, &batch, "label", DataType::Bytes, &[3], Bytes::Host(&out)).unwrap();
    assert_eq!(parts, vec![(vec![1, 1], 0..5), (vec![2, 1], 5..out.len())]);
    assert_eq!(decode_strings(&out[parts[1].1.clone()]).unwrap(), vec![&b"yy"[..], b"zzz"]);
    // malformed bodies: the input and the problem are named
    let err = |shape: &[i64], b: &[u8]| {
        check_request(&c, &p, vec![t("text", DataType::Bytes, shape, vec![b])])
            .unwrap_err()
            .to_string()
    };
    assert!(
        err(&[2, 1], &one).contains("input 'text' holds 1 strings but shape [2, 1] needs 2"),
        "{}",
        err(&[2, 1], &one)
    );
    let e = err(&[1, 1], &[9, 0, 0, 0, b'a']);
    assert!(
        e.contains(
            "input 'text' is malformed BYTES: element 0 says it has 9 bytes but only 1 remain"
        ),
        "{e}"
    );
    let e = err(&[1, 1], &[1, 0]);
    assert!(e.contains("input 'text' is malformed BYTES"), "{e}");
    // an engine whose string output does not match its shape is caught
    assert!(
        scatter_ranges(&c, &batch, "label", DataType::Bytes, &[3], Bytes::Host(&out[..6])).is_err()
    );
}

#[test]
fn non_batching_model_runs_requests_alone() {
    let c = ModelConfig::from_json(
            r#"{"max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [3]}], "output": []}"#,
        )
        .unwrap();
    let a = f32s(&[1.0, 2.0, 3.0]);
    let r1 =
        check_request(&c, &InputPolicy::default(), vec![t("A", DataType::F32, &[3], vec![&a])])
            .unwrap();
    let r2 =
        check_request(&c, &InputPolicy::default(), vec![t("A", DataType::F32, &[3], vec![&a])])
            .unwrap();
    assert_eq!(group_by_shape(&c, &[&r1, &r2]), vec![vec![0], vec![1]]);
    let batch = assemble(&c, &[&r1]).unwrap();
    assert_eq!(batch.tensors[0].shape, vec![3]);
    assert_eq!(
        scatter_ranges(&c, &batch, "Y", DataType::F32, &[3], Bytes::Host(&[])).unwrap(),
        vec![(vec![3], 0..12)]
    );
}

#[test]
fn a_string_correlation_id_is_read_from_triton_s_fixed_size_control_buffer() {
    use crate::tensor::encode_strings;
    let mut c = ModelConfig::from_json(
        r#"{"max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
            "sequence_batching": {"control_input": [{"name": "CORRID",
                "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_STRING"}]}]}}"#,
    )
    .unwrap();
    c.add_sequence_inputs().unwrap();
    assert_eq!(c.sequence.as_ref().unwrap().string_corrid.as_deref(), Some("CORRID"));
    let p = InputPolicy::default();
    let x = f32s(&[1.0]);
    // as Triton fills it: the id, then the buffer's unused bytes
    let mut short = encode_strings(&["seq-7"]).unwrap();
    short.extend([0u8; 23]);
    let mut long = encode_strings(&["sequence-0042"]).unwrap();
    long.extend([0xAB; 15]);
    let req = |id: &'static [u8]| {
        vec![
            t("x", DataType::F32, &[1, 1], vec![&x]),
            t("CORRID", DataType::Bytes, &[1, 1], vec![id]),
        ]
    };
    let short: &'static [u8] = Box::leak(short.into_boxed_slice());
    let long: &'static [u8] = Box::leak(long.into_boxed_slice());
    let r1 = check_request(&c, &p, req(short)).unwrap();
    let r2 = check_request(&c, &p, req(long)).unwrap();
    let batch = assemble(&c, &[&r1, &r2]).unwrap();
    let ids = batch.tensors.iter().find(|t| t.name == "CORRID").unwrap().host_bytes().unwrap();
    assert_eq!(decode_strings(ids).unwrap(), vec![&b"seq-7"[..], b"sequence-0042"]);
    // a length past the buffer is still refused, naming the input
    let e = check_request(&c, &p, req(&[40, 0, 0, 0, b'a'])).unwrap_err().to_string();
    assert!(e.contains("correlation id input 'CORRID'") && e.contains("40 bytes"), "{e}");
    // a string input that is not the correlation id keeps the strict check
    let strict = ModelConfig::from_json(
        r#"{"max_batch_size": 8, "input": [{"name": "CORRID", "data_type": "TYPE_STRING", "dims": [1]}]}"#,
    )
    .unwrap();
    assert!(check_request(&strict, &p, vec![t("CORRID", DataType::Bytes, &[1, 1], vec![short])])
        .is_err());
}

#[test]
fn ragged_inputs_batch_whatever_their_size_into_one_flat_tensor() {
    let c = ModelConfig::from_json(
        r#"{"max_batch_size": 8,
            "input": [{"name": "V", "data_type": "TYPE_INT32", "dims": [-1], "allow_ragged_batch": true},
                      {"name": "L", "data_type": "TYPE_INT32", "dims": [2]}]}"#,
    )
    .unwrap();
    let p = InputPolicy::default();
    let (v1, v2) = (i32s(&[1, 2, 3]), i32s(&[4, 5, 6, 7, 8]));
    let (l1, l2) = (i32s(&[2, 1]), i32s(&[0, 5]));
    let r = |v: &'static [u8], n: i64, l: &'static [u8]| {
        check_request(
            &c,
            &p,
            vec![t("V", DataType::I32, &[1, n], vec![v]), t("L", DataType::I32, &[1, 2], vec![l])],
        )
        .unwrap()
    };
    let (v1, v2, l1, l2) = (v1.leak(), v2.leak(), l1.leak(), l2.leak());
    let (r1, r2) = (r(v1, 3, l1), r(v2, 5, l2));
    assert_eq!(group_by_shape(&c, &[&r1, &r2]), vec![vec![0, 1]], "sizes differ, one batch");
    let batch = assemble(&c, &[&r1, &r2]).unwrap();
    assert_eq!(batch.tensors[0].shape, vec![8], "the ragged input: every element, flat");
    assert_eq!(batch.tensors[0].host_bytes().unwrap(), i32s(&[1, 2, 3, 4, 5, 6, 7, 8]));
    assert_eq!(batch.tensors[1].shape, vec![2, 2]);
    // without allow_ragged_batch the same requests run apart
    let fixed = ModelConfig { ragged: Vec::new(), ..c.clone() };
    assert_eq!(group_by_shape(&fixed, &[&r1, &r2]), vec![vec![0], vec![1]]);
}

#[test]
fn host_joins_large_and_small_keep_every_byte_in_order() {
    // pieces of odd sizes, one empty, tens of MB in all (a batch of DLRM-v2's keys)
    let sizes = [3usize, 5 << 20, 0, 1, 700_001, 9 << 20, 17];
    let pieces: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (j * 31 + i * 7 + j / 4093) as u8).collect())
        .collect();
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    let whole = pieces.concat();
    assert!(join_host(&refs).as_slice() == whole.as_slice(), "a large join");
    let small: Vec<&[u8]> = vec![refs[0], refs[2], refs[4], refs[6]];
    assert!(join_host(&small).as_slice() == small.concat().as_slice(), "a small join");
    assert!(join_host(&[]).is_empty());
}
