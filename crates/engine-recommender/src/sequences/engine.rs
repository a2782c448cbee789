//! One sequence recommender instance: a batch's ids looked up table by table in one call,
//! each lookup's rows handed to the network as its input.

use triton_rust_core::batch::{BatchData, BatchTensor};
use triton_rust_core::config::TensorSpec;
use triton_rust_core::engine::{Engine, OutputView};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::{Bytes, DataType};
use triton_rust_engine_aoti::AotiEngine;
use triton_rust_engine_embedding::EmbeddingEngine;

use super::Lookup;

/// A batch input's bytes in host memory (the only place its ids are taken from so far).
fn host<'a>(t: &'a BatchTensor<'_>) -> Result<&'a [u8]> {
    t.host_bytes().ok_or_else(|| {
        Error::unsupported(format!("input '{}' in GPU memory is not taken yet", t.name))
    })
}

/// One instance: the store's lookup and the network's package.
pub(super) struct SequenceEngine {
    pub(super) lookup: EmbeddingEngine,
    pub(super) network: AotiEngine,
    pub(super) lookups: Vec<Lookup>,
    pub(super) tables: usize,
    pub(super) net_inputs: Vec<TensorSpec>,
    pub(super) net_outputs: Vec<String>,
}

impl Engine for SequenceEngine {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let by_name = |name: &str| -> Result<&BatchTensor<'_>> {
            inputs
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| Error::internal(format!("no input '{name}' in the batch")))
        };
        // every lookup's ids (little-endian INT64, as HPS's KEYS are), table by table, in one
        // buffer: the lookup's keys are the batch's bytes, copied once; and each lookup's rows,
        // its place (in elements) in its table's block, the tables one after the other
        let ids: Vec<&[u8]> =
            self.lookups.iter().map(|l| host(by_name(&l.ids)?)).collect::<Result<_>>()?;
        let mut key_bytes = Vec::with_capacity(ids.iter().map(|b| b.len()).sum());
        let mut numkeys = vec![0i32; self.tables];
        let mut parts: Vec<(usize, usize)> = vec![(0, 0); self.lookups.len()];
        let mut at = 0usize;
        for (t, count) in numkeys.iter_mut().enumerate() {
            for (i, (l, ids)) in self.lookups.iter().zip(&ids).enumerate() {
                if l.table == t {
                    key_bytes.extend_from_slice(ids);
                    *count += (ids.len() / 8) as i32;
                    parts[i] = (at, ids.len() / 8 * l.dim);
                    at += parts[i].1;
                }
            }
        }
        let num_bytes: Vec<u8> = numkeys.iter().flat_map(|n| n.to_le_bytes()).collect();
        let lookup_in = [
            BatchTensor {
                name: "KEYS".into(),
                dtype: DataType::I64,
                shape: vec![(key_bytes.len() / 8) as i64],
                data: BatchData::Borrowed(Bytes::Host(&key_bytes)),
            },
            BatchTensor {
                name: "NUMKEYS".into(),
                dtype: DataType::I32,
                shape: vec![self.tables as i64],
                data: BatchData::Borrowed(Bytes::Host(&num_bytes)),
            },
        ];
        let SequenceEngine { lookup, network, lookups, net_inputs, net_outputs, .. } = self;
        let wanted: Vec<&str> =
            net_outputs.iter().map(String::as_str).filter(|o| outputs.contains(o)).collect();
        // the network runs on the rows where the lookup wrote them (host or GPU memory), while
        // they are lent: nothing is copied between the two
        let mut ran = false;
        lookup.run(&lookup_in, &["OUTPUT0"], &mut |rows| {
            // the rows in the type the lookup declares (the network's: FP32 or FP16)
            let size = rows.dtype.size().unwrap_or(4);
            if rows.data.len() != at * size {
                return Err(Error::internal(format!(
                    "the lookup gave {} bytes of rows, {} expected",
                    rows.data.len(),
                    at * size
                )));
            }
            let mut net_in = Vec::with_capacity(net_inputs.len());
            for spec in net_inputs.iter() {
                if let Some(i) = lookups.iter().position(|l| l.rows == spec.name) {
                    let ((from, n), dim) = (parts[i], lookups[i].dim.max(1));
                    net_in.push(BatchTensor {
                        name: spec.name.clone(),
                        dtype: rows.dtype,
                        shape: vec![(n / dim) as i64, dim as i64],
                        data: BatchData::Borrowed(
                            rows.data.slice(from * size..(from + n) * size).ok_or_else(|| {
                                Error::internal("a lookup's rows past the lookup's output")
                            })?,
                        ),
                    });
                } else {
                    let t = by_name(&spec.name)?;
                    let bytes =
                        t.bytes().ok_or_else(|| Error::internal("an input not gathered"))?;
                    net_in.push(BatchTensor {
                        name: t.name.clone(),
                        dtype: t.dtype,
                        shape: vec![t.shape.iter().product::<i64>()],
                        data: BatchData::Borrowed(bytes),
                    });
                }
            }
            ran = true;
            network.run(&net_in, &wanted, sink)
        })?;
        if !ran {
            return Err(Error::internal("the lookup gave no rows"));
        }
        Ok(())
    }
}
