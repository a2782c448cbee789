//! Which CUDA graph a batch replays: its input shapes fitted to the batch-size buckets
//! ([`LoadOptions::graph_buckets`](crate::types::LoadOptions)). Both engines that capture graphs
//! (ONNX Runtime in the backend, libtorch in the plugin) fit batches by this one rule.

/// Where a batch's input shapes fall among the buckets.
#[derive(Debug, PartialEq, Eq)]
pub enum Fit {
    /// Runs in a graph: its inputs' first dimension padded to this row count (None: the
    /// exact shapes, a model without batching).
    Graph(Option<i64>),
    /// More rows than the largest bucket.
    TooMany(i64),
    /// Without batching: rows that no `graph_spec` batch size names.
    NotListed(i64),
    /// Inputs that disagree on the batch, or a scalar input where rows are needed: no
    /// graph (the run says what is wrong).
    Ragged,
}

/// Fits a batch of these input shapes: with batching, each input's first dimension is
/// padded to the smallest bucket holding the batch; without batching, the shapes stay
/// exact, and when `buckets` name rows (`graph_spec` of a model without batching), only
/// requests whose inputs all have one of them as their first dimension run in a graph.
pub fn fit<S: AsRef<[i64]>>(buckets: &[i64], batching: bool, shapes: &[S]) -> Fit {
    if !batching && buckets.is_empty() {
        return Fit::Graph(None);
    }
    let Some(&n) = shapes.first().and_then(|s| s.as_ref().first()) else { return Fit::Ragged };
    if shapes.iter().any(|s| s.as_ref().first() != Some(&n)) {
        return Fit::Ragged;
    }
    if !batching {
        return if buckets.contains(&n) { Fit::Graph(None) } else { Fit::NotListed(n) };
    }
    match buckets.iter().find(|&&b| b >= n) {
        Some(&b) => Fit::Graph(Some(b)),
        None => Fit::TooMany(n),
    }
}

/// `shape` as the graph holds it: its first dimension set to the padded rows, if any.
pub fn padded(shape: &[i64], rows: Option<i64>) -> Vec<i64> {
    let mut s = shape.to_vec();
    if let (Some(b), Some(first)) = (rows, s.first_mut()) {
        *first = b;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{fit, padded, Fit};

    #[test]
    fn a_batch_is_padded_to_its_bucket_and_an_unbatched_request_graphed_at_listed_rows_only() {
        let buckets = [1, 2, 4, 8, 16];
        assert_eq!(fit(&buckets, true, &[[3, 384], [3, 384]]), Fit::Graph(Some(4)));
        assert_eq!(fit(&buckets, true, &[[16, 3]]), Fit::Graph(Some(16)));
        assert_eq!(fit(&buckets, true, &[[17, 3]]), Fit::TooMany(17));
        assert_eq!(fit(&buckets, true, &[[2, 3], [3, 3]]), Fit::Ragged, "inputs disagree");
        assert_eq!(fit(&buckets, true, &[[0i64; 0]]), Fit::Ragged, "a scalar input");
        // without batching: exact shapes; with graph_spec's rows, only those rows, unpadded
        assert_eq!(fit(&[], false, &[[5, 26], [5, 13]]), Fit::Graph(None));
        assert_eq!(fit(&[], false, &[[0i64; 0]]), Fit::Graph(None), "nothing listed: any shape");
        let rows = [256, 4096];
        assert_eq!(fit(&rows, false, &[[4096, 26], [4096, 13]]), Fit::Graph(None));
        assert_eq!(fit(&rows, false, &[[300, 26], [300, 13]]), Fit::NotListed(300));
        assert_eq!(fit(&rows, false, &[[256, 26], [4096, 13]]), Fit::Ragged);
        assert_eq!(fit(&rows, false, &[[0i64; 0]]), Fit::Ragged, "a scalar input has no rows");
        assert_eq!(padded(&[3, 384], Some(4)), vec![4, 384]);
        assert_eq!(padded(&[3, 384], None), vec![3, 384]);
    }
}
