//! Pooled lookups: each sample's bag of keys per table, its rows reduced to one. The bags of a
//! batch are laid out table after table ([`Bags`]), the layout the GPU lookup takes them in;
//! on the host the same bags are summed here ([`pool`]).

use triton_rust_core::error::{Error, Result};
use triton_rust_embedding::InstanceCaches;

use rayon::prelude::*;

use crate::settings::{Combiner, Pooling, PAD};

/// Batches of at least this many keys lay their tables out in parallel.
const PARALLEL_KEYS: usize = 1 << 16;

/// A batch's bags, table after table: every key (padding left out), each table's count, and
/// where each bag starts (bag `t * batch + b`, one more entry at the end). An instance keeps
/// one and refills it for each batch ([`Bags::refill_fixed`], [`Bags::refill_ragged`]): a batch
/// of MLPerf's 214 keys a sample writes megabytes here, and memory the process already holds
/// takes them without the page faults of a fresh allocation (8.9 ms against 1.7 ms for 4096
/// samples, `time_bags_at_mlperf_hotness`).
#[derive(Default)]
pub(crate) struct Bags {
    flat: Vec<i64>,
    counts: Vec<usize>,
    offsets: Vec<i32>,
    batch: usize,
}

impl Bags {
    /// Fixed hotness: each sample's tables' bags one after the other, padded with [`PAD`].
    pub(crate) fn fixed(pooling: &Pooling, keys: &[i64]) -> Bags {
        let mut bags = Bags::default();
        bags.refill_fixed(pooling, keys);
        bags
    }

    /// [`Bags::fixed`] into this one's memory. A large batch's tables are laid out in
    /// parallel: the bags' sizes, then their keys, each table by a thread of its own.
    pub(crate) fn refill_fixed(&mut self, pooling: &Pooling, keys: &[i64]) {
        let width = pooling.width().max(1);
        let batch = keys.len() / width;
        let tables = pooling.hotness.len();
        // where each table's bag starts in a sample
        let at: Vec<usize> = pooling
            .hotness
            .iter()
            .scan(0, |a, &h| {
                let s = *a;
                *a += h;
                Some(s)
            })
            .collect();
        let span = |t: usize| at[t]..at[t] + pooling.hotness[t];
        let parallel = keys.len() >= PARALLEL_KEYS;
        let Bags { flat, counts, offsets, .. } = self;
        // each bag's size, then where it starts (all bags, table after table)
        offsets.clear();
        offsets.resize(tables * batch + 1, 0);
        let size_bags = |(t, sizes): (usize, &mut [i32])| {
            for (size, sample) in sizes.iter_mut().zip(keys.chunks_exact(width)) {
                *size = sample[span(t)].iter().filter(|&&k| k != PAD).count() as i32;
            }
        };
        let sizes = &mut offsets[..tables * batch];
        if parallel && batch > 0 {
            sizes.par_chunks_mut(batch).enumerate().for_each(size_bags);
        } else if batch > 0 {
            sizes.chunks_mut(batch).enumerate().for_each(size_bags);
        }
        let mut total = 0i32;
        for o in offsets.iter_mut() {
            let size = *o;
            *o = total;
            total += size;
        }
        counts.clear();
        counts
            .extend((0..tables).map(|t| (offsets[(t + 1) * batch] - offsets[t * batch]) as usize));
        // every table's keys into its own part of `flat`
        flat.clear();
        flat.resize(total as usize, 0);
        let mut parts = Vec::with_capacity(tables);
        let mut rest = &mut flat[..];
        for &c in counts.iter() {
            let (part, tail) = rest.split_at_mut(c);
            parts.push(part);
            rest = tail;
        }
        let fill = |(t, part): (usize, &mut [i64])| {
            let mut i = 0;
            for sample in keys.chunks_exact(width) {
                for &k in sample[span(t)].iter().filter(|&&k| k != PAD) {
                    part[i] = k;
                    i += 1;
                }
            }
        };
        if parallel {
            parts.into_par_iter().enumerate().for_each(fill);
        } else {
            parts.into_iter().enumerate().for_each(fill);
        }
        self.batch = batch;
    }

    /// Ragged bags: `lengths` `[batch, tables]` says how many of `keys` each sample has per
    /// table, sample after sample, each sample's tables in order (a request's keys are its
    /// own, so requests concatenate).
    pub(crate) fn ragged(tables: usize, keys: &[i64], lengths: &[i32]) -> Result<Bags> {
        let mut bags = Bags::default();
        bags.refill_ragged(tables, keys, lengths)?;
        Ok(bags)
    }

    /// [`Bags::ragged`] into this one's memory.
    pub(crate) fn refill_ragged(
        &mut self,
        tables: usize,
        keys: &[i64],
        lengths: &[i32],
    ) -> Result<()> {
        let tables = tables.max(1);
        let batch = lengths.len() / tables;
        // where each sample's bag of each table starts in `keys`
        let starts = bag_starts(keys.len(), lengths)?;
        let Bags { flat, counts, offsets, .. } = self;
        flat.clear();
        counts.clear();
        offsets.clear();
        flat.reserve(keys.len());
        offsets.reserve(tables * batch + 1);
        for t in 0..tables {
            let start = flat.len();
            for b in 0..batch {
                let i = b * tables + t;
                offsets.push(flat.len() as i32);
                flat.extend_from_slice(&keys[starts[i] as usize..starts[i + 1] as usize]);
            }
            counts.push(flat.len() - start);
        }
        offsets.push(flat.len() as i32);
        self.batch = batch;
        Ok(())
    }

    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// Whether no bag holds a key.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.flat.is_empty()
    }

    /// Every key table after table, each table's count, and where each bag starts.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn table_major(&self) -> (&[i64], &[usize], &[i32]) {
        (&self.flat, &self.counts, &self.offsets)
    }

    /// Table `t`'s keys of the whole batch.
    pub(crate) fn keys(&self, t: usize) -> &[i64] {
        let start: usize = self.counts[..t].iter().sum();
        &self.flat[start..start + self.counts[t]]
    }
}

/// Where each bag of a ragged batch starts among its `keys` keys: `lengths` `[batch, tables]`
/// (sample after sample, each sample's tables in order) summed, one more entry at the end.
/// Lengths that are negative or do not sum to the keys are refused.
pub(crate) fn bag_starts(keys: usize, lengths: &[i32]) -> Result<Vec<i32>> {
    let mut starts = Vec::with_capacity(lengths.len() + 1);
    let mut at = 0usize;
    for &n in lengths {
        let n =
            usize::try_from(n).map_err(|_| Error::invalid_arg(format!("a negative length {n}")))?;
        starts.push(at as i32);
        at += n;
        if at > keys {
            return Err(Error::invalid_arg(format!(
                "the lengths need more than the {keys} keys sent"
            )));
        }
    }
    if at != keys {
        return Err(Error::invalid_arg(format!(
            "the lengths sum to {at} but {keys} keys were sent"
        )));
    }
    starts.push(at as i32);
    Ok(starts)
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
    let (tables, batch) = (bags.counts.len(), bags.batch);
    out.fill(0.0);
    let mut start = 0usize;
    for t in 0..tables {
        let keys = &bags.flat[start..start + bags.counts[t]];
        let mut rows = vec![0f32; keys.len() * dim];
        if !keys.is_empty() {
            caches.lookup(t, keys, &mut rows)?;
        }
        for b in 0..batch {
            let (first, last) =
                (bags.offsets[t * batch + b] as usize, bags.offsets[t * batch + b + 1] as usize);
            let pooled = &mut out[(b * tables + t) * dim..][..dim];
            for row in rows[(first - start) * dim..(last - start) * dim].chunks_exact(dim) {
                for (p, v) in pooled.iter_mut().zip(row) {
                    *p += v;
                }
            }
            let n = last - first;
            if combiner == Combiner::Mean && n > 1 {
                for p in pooled.iter_mut() {
                    *p /= n as f32;
                }
            }
        }
        start += bags.counts[t];
    }
    Ok(())
}
