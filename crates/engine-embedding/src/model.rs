//! What an embedding model's instances share: its settings, its store, its tensors, and the
//! checks of a request that only the store can make.

use std::sync::Arc;

use triton_rust_core::batch::RequestTensor;
use triton_rust_core::config::{ModelConfig, TensorConfig, TensorSpec};
use triton_rust_core::engine::Signature;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::DataType;
use triton_rust_embedding::EmbeddingStore;

use crate::pool::Bags;
use crate::rows::from_chunks;
use crate::settings::{Interface, StoreSettings, PAD};

/// What an embedding model's instances share.
pub(crate) struct Model {
    pub(crate) settings: StoreSettings,
    pub(crate) store: Arc<EmbeddingStore>,
    /// The lookup interfaces' rows: F32, or F16 when the output is declared so.
    pub(crate) rows_type: DataType,
    pub(crate) sig: Signature,
}

/// The tensors of the model's interface, named as the config names them.
pub(crate) fn signature(
    settings: &StoreSettings,
    store: &EmbeddingStore,
    cfg: &ModelConfig,
    rows_type: DataType,
) -> Result<Signature> {
    let name_or = |list: &[TensorConfig], i: usize, default: &str| {
        list.get(i).map(|t| t.name.clone()).unwrap_or_else(|| default.to_string())
    };
    let t = |name: String, dtype, shape: Vec<i64>| TensorSpec { name, dtype, shape };
    let tables = store.table_count() as i64;
    let (inputs, outputs) = match settings.interface {
        Interface::Hps => {
            if cfg.max_batch_size != 0 {
                return Err(Error::invalid_arg("the hps interface takes a whole request's keys: set max_batch_size: 0 (or use embedding_interface batched)"));
            }
            (
                vec![
                    t(name_or(&cfg.inputs, 0, "KEYS"), DataType::I64, vec![-1]),
                    t(name_or(&cfg.inputs, 1, "NUMKEYS"), DataType::I32, vec![-1]),
                ],
                vec![t(name_or(&cfg.outputs, 0, "OUTPUT0"), rows_type, vec![-1])],
            )
        }
        Interface::Batched | Interface::Pooled => {
            let dim = store.dim(0);
            if (0..store.table_count()).any(|i| store.dim(i) != dim) {
                return Err(Error::invalid_arg("the batched and pooled interfaces need every table to have the same dim (use the hps interface otherwise)"));
            }
            // a sample's keys: one per table, or each table's bag (its hotness) after the other;
            // or, with a second input (the lengths, [tables] per sample), as many as it says.
            // Lengths ragged too (`allow_ragged_batch`): a request holds many samples, its
            // lengths [samples × tables] sample after sample (docs/torchrec.md)
            let ragged = settings.interface == Interface::Pooled && cfg.inputs.len() == 2;
            let width = settings.pooling.as_ref().map_or(tables, |p| p.width() as i64);
            let keys = name_or(&cfg.inputs, 0, "KEYS");
            let inputs = if ragged {
                let lengths = name_or(&cfg.inputs, 1, "LENGTHS");
                let per_request = if cfg.ragged.contains(&lengths) { -1 } else { tables };
                vec![
                    t(keys, DataType::I64, vec![-1, -1]),
                    t(lengths, DataType::I32, vec![-1, per_request]),
                ]
            } else {
                vec![t(keys, DataType::I64, vec![-1, width])]
            };
            (
                inputs,
                vec![t(
                    name_or(&cfg.outputs, 0, "OUTPUT0"),
                    rows_type,
                    vec![-1, tables, dim as i64],
                )],
            )
        }
        Interface::Update => {
            if cfg.max_batch_size != 0 {
                return Err(Error::invalid_arg(
                    "the update interface takes a whole request: set max_batch_size: 0",
                ));
            }
            (
                vec![
                    t(name_or(&cfg.inputs, 0, "KEYS"), DataType::I64, vec![-1]),
                    t(name_or(&cfg.inputs, 1, "NUMKEYS"), DataType::I32, vec![-1]),
                    t(name_or(&cfg.inputs, 2, "VECTORS"), DataType::F32, vec![-1]),
                ],
                vec![t(name_or(&cfg.outputs, 0, "UPDATED"), DataType::I64, vec![1])],
            )
        }
    };
    Ok(Signature { inputs, outputs })
}

impl Model {
    fn store(&self) -> &Arc<EmbeddingStore> {
        &self.store
    }

    /// Whether the pooled interface takes its bags ragged, with their lengths as an input.
    pub(crate) fn lengths_input(&self) -> bool {
        self.settings.interface == Interface::Pooled && self.sig.inputs.len() == 2
    }

    /// Whether a ragged pooled model's request holds many samples: its lengths ragged too,
    /// `[samples × tables]`, so its first dimension (1) is not its sample count.
    pub(crate) fn many_samples(&self) -> bool {
        self.lengths_input() && self.sig.inputs[1].shape.get(1) == Some(&-1)
    }

    /// The samples of a many-samples request ([`Model::many_samples`]): its lengths per table.
    pub(crate) fn request_rows(&self, inputs: &[RequestTensor<'_>]) -> Option<usize> {
        let tables = self.store().table_count().max(1);
        self.many_samples().then(|| inputs[1].byte_size() / 4 / tables)
    }

    /// Splits a request's KEYS by NUMKEYS, checking what only we can see.
    pub(crate) fn split<'k>(&self, keys: &'k [i64], numkeys: &[i32]) -> Result<Vec<&'k [i64]>> {
        self.check_counts(numkeys, keys.len())?;
        let mut out = Vec::with_capacity(numkeys.len());
        let mut at = 0usize;
        for (t, &n) in numkeys.iter().enumerate() {
            let part = &keys[at..at + n as usize];
            self.check_vocabulary(t, part)?;
            out.push(part);
            at += n as usize;
        }
        Ok(out)
    }

    /// Checks NUMKEYS against the store and the number of keys sent.
    fn check_counts(&self, numkeys: &[i32], keys: usize) -> Result<()> {
        let store = self.store();
        let (kname, nname) = (&self.sig.inputs[0].name, &self.sig.inputs[1].name);
        if numkeys.len() != store.table_count() {
            return Err(Error::invalid_arg(format!(
                "input '{nname}' has {} entries but the store has {} tables",
                numkeys.len(),
                store.table_count()
            )));
        }
        if let Some((t, n)) = numkeys.iter().enumerate().find(|(_, &n)| n < 0) {
            return Err(Error::invalid_arg(format!(
                "input '{nname}' has a negative count {n} for table {t}"
            )));
        }
        let total: i64 = numkeys.iter().map(|&n| n as i64).sum();
        if total != keys as i64 {
            return Err(Error::invalid_arg(format!(
                "input '{nname}' sums to {total} but input '{kname}' holds {keys} keys"
            )));
        }
        Ok(())
    }

    /// Whether any table has a vocabulary size to check keys against.
    pub(crate) fn checks_vocabulary(&self) -> bool {
        self.settings.vocabulary.iter().any(Option::is_some)
    }

    fn check_vocabulary(&self, table: usize, keys: &[i64]) -> Result<()> {
        if let Some(Some(size)) = self.settings.vocabulary.get(table) {
            if let Some(k) = keys.iter().find(|&&k| k < 0 || k as u64 >= *size) {
                let name =
                    self.store().tables().nth(table).map(|t| t.name.clone()).unwrap_or_default();
                return Err(Error::invalid_arg(format!(
                    "input '{}': key {k} is out of range for table '{name}' (vocabulary size {size})",
                    self.sig.inputs[0].name
                )));
            }
        }
        Ok(())
    }
    /// The checks of one request only the store can make: key counts, vocabularies, values.
    pub(crate) fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        let m = self;
        match m.settings.interface {
            Interface::Hps if !m.checks_vocabulary() => {
                // nothing to read in the keys themselves: check their count only
                m.check_counts(&from_chunks(&inputs[1], i32::from_le_bytes), inputs[0].byte_size() / 8)
            }
            Interface::Hps | Interface::Update => {
                let keys = from_chunks(&inputs[0], i64::from_le_bytes);
                let numkeys = from_chunks(&inputs[1], i32::from_le_bytes);
                let parts = m.split(&keys, &numkeys)?;
                if m.settings.interface == Interface::Update {
                    let want: usize = parts.iter().enumerate().map(|(t, p)| p.len() * m.store().dim(t)).sum();
                    let got = inputs[2].byte_size() / 4;
                    if got != want {
                        return Err(Error::invalid_arg(format!(
                            "input '{}' holds {got} values; the keys need {want} (Σ numkeys_i × dim_i)",
                            m.sig.inputs[2].name
                        )));
                    }
                    let vals = from_chunks(&inputs[2], f32::from_le_bytes);
                    if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
                        return Err(Error::invalid_arg(format!("input '{}' holds a NaN or infinite value at element {i}", m.sig.inputs[2].name)));
                    }
                }
                Ok(())
            }
            Interface::Batched if !m.checks_vocabulary() => Ok(()),
            Interface::Batched if inputs[0].chunks.iter().any(|c| !c.device().is_host()) => Err(Error::invalid_arg(format!(
                "input '{}' is in GPU memory, where its keys cannot be checked against vocabulary_size_per_table; \
                 send it in host memory, or serve this model without vocabulary sizes",
                m.sig.inputs[0].name
            ))),
            Interface::Pooled if m.lengths_input() => {
                let (kname, lname) = (&m.sig.inputs[0].name, &m.sig.inputs[1].name);
                let lengths = from_chunks(&inputs[1], i32::from_le_bytes);
                let keys = inputs[0].byte_size() / 8;
                let tables = m.store().table_count();
                if m.many_samples() && (lengths.is_empty() || !lengths.len().is_multiple_of(tables)) {
                    return Err(Error::invalid_arg(format!(
                        "input '{lname}' holds {} lengths, not a whole number of samples of \
                         {tables} tables: a request's lengths are [samples × tables], sample \
                         after sample, at least one sample",
                        lengths.len()
                    )));
                }
                let mut total = 0usize;
                for &n in lengths.iter() {
                    let n = usize::try_from(n).map_err(|_| {
                        Error::invalid_arg(format!("input '{lname}': a negative length {n}"))
                    })?;
                    total += n;
                }
                if total != keys {
                    return Err(Error::invalid_arg(format!(
                        "input '{lname}': the lengths sum to {total} but {keys} keys were sent"
                    )));
                }
                // a negative key is refused where the batch's keys are read for the lookup
                // (`PooledRun::run`), as one sent in GPU memory is: reading every key of
                // each request here as well took about a quarter of the server's time for
                // MLPerf DLRM-v2's keys in host memory (bench/gpu/results/dlrm-v2/front_end/,
                // call 15); with vocabulary sizes the keys are read here anyway
                if m.checks_vocabulary() {
                    let keys = from_chunks(&inputs[0], i64::from_le_bytes);
                    if let Some((i, k)) = first_below(&keys, 0) {
                        return Err(negative_key(kname, i, k, true));
                    }
                    let bags = Bags::ragged(m.store().table_count(), &keys, &lengths)?;
                    for t in 0..m.store().table_count() {
                        m.check_vocabulary(t, bags.keys(t))?;
                    }
                }
                Ok(())
            }
            Interface::Pooled => {
                // as above: a negative key is refused where the batch's keys are read
                if let (true, Some(pooling)) = (m.checks_vocabulary(), m.settings.pooling.as_ref()) {
                    let keys = from_chunks(&inputs[0], i64::from_le_bytes);
                    if let Some((i, k)) = first_below(&keys, PAD) {
                        return Err(negative_key(&m.sig.inputs[0].name, i, k, false));
                    }
                    let bags = Bags::fixed(pooling, &keys);
                    for t in 0..pooling.hotness.len() {
                        m.check_vocabulary(t, bags.keys(t))?;
                    }
                }
                Ok(())
            }
            Interface::Batched => {
                let keys = from_chunks(&inputs[0], i64::from_le_bytes);
                let tables = m.store().table_count();
                for t in 0..tables {
                    let col: Vec<i64> = keys.iter().skip(t).step_by(tables).copied().collect();
                    m.check_vocabulary(t, &col)?;
                }
                Ok(())
            }
        }
    }
}

/// A client's negative key (other than the padding of fixed bags, `ragged` false): the
/// input, the key, its element.
pub(crate) fn negative_key(input: &str, element: usize, key: i64, ragged: bool) -> Error {
    let why = if ragged {
        String::new()
    } else {
        format!(" (a bag shorter than its table's hotness is padded with {PAD})")
    };
    Error::invalid_arg(format!("input '{input}': key {key} at element {element} is negative{why}"))
}

/// The first of `keys` below `least`, with its index.
pub(crate) fn first_below(keys: &[i64], least: i64) -> Option<(usize, i64)> {
    keys.iter().enumerate().find(|(_, &k)| k < least).map(|(i, &k)| (i, k))
}
