//! Pooled lookups on the host: each sample's bag of keys per table, its rows reduced to one.

use triton_rust_core::error::{Error, Result};
use triton_rust_embedding::InstanceCaches;

use crate::settings::{Combiner, Pooling, PAD};

/// A batch's bags, table by table: the keys to look up and the sample each belongs to.
pub(crate) struct Bags {
    tables: Vec<(Vec<i64>, Vec<usize>)>,
    batch: usize,
}

impl Bags {
    /// Fixed hotness: each sample's tables' bags one after the other, padded with [`PAD`].
    pub(crate) fn fixed(pooling: &Pooling, keys: &[i64]) -> Bags {
        let width = pooling.width().max(1);
        let mut tables = Vec::with_capacity(pooling.hotness.len());
        let mut at = 0;
        for &h in &pooling.hotness {
            let (mut looked, mut owner) = (Vec::new(), Vec::new());
            for (b, sample) in keys.chunks_exact(width).enumerate() {
                for &k in sample[at..at + h].iter().filter(|&&k| k != PAD) {
                    looked.push(k);
                    owner.push(b);
                }
            }
            tables.push((looked, owner));
            at += h;
        }
        Bags { tables, batch: keys.len() / width }
    }

    /// Ragged bags: `lengths` `[batch, tables]` says how many of `keys` each sample has per
    /// table, sample after sample, each sample's tables in order (a request's keys are its
    /// own, so requests concatenate).
    pub(crate) fn ragged(tables: usize, keys: &[i64], lengths: &[i32]) -> Result<Bags> {
        let mut per = vec![(Vec::new(), Vec::new()); tables];
        let mut at = 0usize;
        for (i, &n) in lengths.iter().enumerate() {
            let n = usize::try_from(n)
                .map_err(|_| Error::invalid_arg(format!("a negative length {n}")))?;
            let bag = keys.get(at..at + n).ok_or_else(|| {
                Error::invalid_arg(format!(
                    "the lengths need more than the {} keys sent",
                    keys.len()
                ))
            })?;
            let (looked, owner) = &mut per[i % tables.max(1)];
            looked.extend_from_slice(bag);
            owner.extend(std::iter::repeat_n(i / tables.max(1), n));
            at += n;
        }
        if at != keys.len() {
            return Err(Error::invalid_arg(format!(
                "the lengths sum to {at} but {} keys were sent",
                keys.len()
            )));
        }
        Ok(Bags { tables: per, batch: lengths.len() / tables.max(1) })
    }

    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// Whether no bag holds a key.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.tables.iter().all(|(k, _)| k.is_empty())
    }

    /// Every key table after table (each table's in sample order), each table's count, and
    /// where each bag starts in that order: bag `t * batch + b`, one more entry at the end.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn table_major(&self) -> (Vec<i64>, Vec<usize>, Vec<i32>) {
        let mut flat = Vec::with_capacity(self.tables.iter().map(|(k, _)| k.len()).sum());
        let mut counts = Vec::with_capacity(self.tables.len());
        let mut offsets = Vec::with_capacity(self.tables.len() * self.batch + 1);
        for (keys, owner) in &self.tables {
            let start = flat.len();
            let mut per = vec![0usize; self.batch];
            for &b in owner {
                per[b] += 1;
            }
            let mut at = start;
            for n in per {
                offsets.push(at as i32);
                at += n;
            }
            flat.extend_from_slice(keys);
            counts.push(keys.len());
        }
        offsets.push(flat.len() as i32);
        (flat, counts, offsets)
    }

    /// Table `t`'s keys of the whole batch.
    pub(crate) fn keys(&self, t: usize) -> &[i64] {
        &self.tables[t].0
    }
}

/// Pools `bags` into `out`, `[batch, tables, dim]`: a bag's rows summed in key order (or
/// their mean), an empty bag's row zeros. Each table's keys of the whole batch go to the
/// store in one lookup.
pub(crate) fn pool(
    caches: &InstanceCaches,
    bags: &Bags,
    combiner: Combiner,
    dim: usize,
    out: &mut [f32],
) -> Result<()> {
    let tables = bags.tables.len();
    out.fill(0.0);
    for (t, (looked, owner)) in bags.tables.iter().enumerate() {
        let mut rows = vec![0f32; looked.len() * dim];
        if !looked.is_empty() {
            caches.lookup(t, looked, &mut rows)?;
        }
        let mut counts = vec![0u32; bags.batch];
        for (row, &b) in rows.chunks_exact(dim).zip(owner) {
            let pooled = &mut out[(b * tables + t) * dim..][..dim];
            for (p, v) in pooled.iter_mut().zip(row) {
                *p += v;
            }
            counts[b] += 1;
        }
        if combiner == Combiner::Mean {
            for (b, &n) in counts.iter().enumerate().filter(|(_, &n)| n > 1) {
                for p in &mut out[(b * tables + t) * dim..][..dim] {
                    *p /= n as f32;
                }
            }
        }
    }
    Ok(())
}
