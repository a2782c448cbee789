//! The tables a store model names, read once from its parameters (HPS's names):
//! `embedding_table_names`, `embedding_vecsize_per_table`, `default_value_for_each_table`,
//! `sparse_files`, `vocabulary_size_per_table`. The embedding engine and the recommender
//! engine both read them here: a value that does not parse is a load error naming the
//! parameter.

use std::collections::BTreeMap;

use triton_rust_core::error::{Error, Result};

/// Per table, in `embedding_table_names` order.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSettings {
    pub names: Vec<String>,
    /// Row width (`embedding_vecsize_per_table`; one value stands for every table).
    pub dims: Vec<usize>,
    /// The row of a key no tier holds (`default_value_for_each_table`, default 0).
    pub defaults: Vec<f32>,
    /// Paths under the version directory (`sparse_files`); empty: `tables/<name>`.
    pub files: Vec<String>,
    /// Keys must lie in [0, size) when given (`vocabulary_size_per_table`).
    pub vocabulary: Vec<Option<u64>>,
}

/// A comma-separated parameter's items, trimmed, empty ones dropped.
pub fn list(parameters: &BTreeMap<String, String>, key: &str) -> Vec<String> {
    parameters
        .get(key)
        .map(|s| s.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect())
        .unwrap_or_default()
}

/// One value per table: `n` items, or one for all; `default` when the key is absent.
fn per_table<T: std::str::FromStr + Clone>(
    parameters: &BTreeMap<String, String>,
    key: &str,
    n: usize,
    default: Option<T>,
) -> Result<Vec<T>> {
    let items = list(parameters, key);
    if items.is_empty() {
        return default
            .map(|d| vec![d; n])
            .ok_or_else(|| Error::invalid_arg(format!("parameter '{key}' is required")));
    }
    let parse = |s: &String| {
        s.parse().map_err(|_| Error::invalid_arg(format!("parameter '{key}': cannot parse '{s}'")))
    };
    if items.len() == 1 && n > 1 {
        return Ok(vec![parse(&items[0])?; n]);
    }
    if items.len() != n {
        return Err(Error::invalid_arg(format!(
            "parameter '{key}' lists {} values for {n} tables",
            items.len()
        )));
    }
    items.iter().map(parse).collect()
}

impl TableSettings {
    pub fn from_parameters(parameters: &BTreeMap<String, String>) -> Result<TableSettings> {
        let names = list(parameters, "embedding_table_names");
        if names.is_empty() {
            return Err(Error::invalid_arg(
                "parameter 'embedding_table_names' is required (comma-separated table names)",
            ));
        }
        let n = names.len();
        let dims = per_table(parameters, "embedding_vecsize_per_table", n, None)?;
        let defaults = per_table(parameters, "default_value_for_each_table", n, Some(0.0))?;
        let files = list(parameters, "sparse_files");
        if !files.is_empty() && files.len() != n {
            return Err(Error::invalid_arg(format!(
                "parameter 'sparse_files' lists {} paths for {n} tables",
                files.len()
            )));
        }
        let vocabulary = if list(parameters, "vocabulary_size_per_table").is_empty() {
            vec![None; n]
        } else {
            per_table::<u64>(parameters, "vocabulary_size_per_table", n, None)?
                .into_iter()
                .map(Some)
                .collect()
        };
        Ok(TableSettings { names, dims, defaults, files, vocabulary })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn tables_parse_strictly() {
        let t = TableSettings::from_parameters(&params(&[
            ("embedding_table_names", "a, b ,c"),
            ("embedding_vecsize_per_table", "4"),
            ("vocabulary_size_per_table", "10,20,30"),
        ]))
        .unwrap();
        assert_eq!(t.names, ["a", "b", "c"]);
        assert_eq!(t.dims, [4, 4, 4]);
        assert_eq!(t.defaults, [0.0; 3]);
        assert_eq!(t.vocabulary, [Some(10), Some(20), Some(30)]);
        let bad = TableSettings::from_parameters(&params(&[
            ("embedding_table_names", "a,b"),
            ("embedding_vecsize_per_table", "4,x"),
        ]))
        .unwrap_err();
        assert!(bad.message().contains("'embedding_vecsize_per_table': cannot parse 'x'"), "{bad}");
        let short = TableSettings::from_parameters(&params(&[
            ("embedding_table_names", "a,b,c"),
            ("embedding_vecsize_per_table", "4,4"),
        ]))
        .unwrap_err();
        assert!(short.message().contains("lists 2 values for 3 tables"), "{short}");
        let none = TableSettings::from_parameters(&params(&[])).unwrap_err();
        assert!(none.message().contains("embedding_table_names"), "{none}");
    }
}
