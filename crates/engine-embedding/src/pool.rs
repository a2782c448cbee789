//! Pooled lookups on the host: each sample's bag of keys per table, its rows reduced to one.

use triton_rust_core::error::Result;
use triton_rust_embedding::InstanceCaches;

use crate::settings::{Combiner, Pooling, PAD};

/// Pools `keys` (`batch` samples, each its tables' bags one after the other, padded with
/// [`PAD`]) into `out`, `[batch, tables, dim]`: a bag's rows summed in key order (or their
/// mean), an empty bag's row zeros. Each table's keys of the whole batch go to the store in
/// one lookup.
pub(crate) fn pool(
    caches: &InstanceCaches,
    pooling: &Pooling,
    keys: &[i64],
    dim: usize,
    out: &mut [f32],
) -> Result<()> {
    let (width, tables) = (pooling.width(), pooling.hotness.len());
    let batch = keys.len().checked_div(width).unwrap_or(0);
    out.fill(0.0);
    let mut at = 0;
    for (t, &h) in pooling.hotness.iter().enumerate() {
        let mut looked = Vec::with_capacity(batch * h);
        let mut owner = Vec::with_capacity(batch * h);
        for (b, sample) in keys.chunks_exact(width).enumerate() {
            for &k in sample[at..at + h].iter().filter(|&&k| k != PAD) {
                looked.push(k);
                owner.push(b);
            }
        }
        let mut rows = vec![0f32; looked.len() * dim];
        if !looked.is_empty() {
            caches.lookup(t, &looked, &mut rows)?;
        }
        let mut counts = vec![0u32; batch];
        for (row, &b) in rows.chunks_exact(dim).zip(&owner) {
            let pooled = &mut out[(b * tables + t) * dim..][..dim];
            for (p, v) in pooled.iter_mut().zip(row) {
                *p += v;
            }
            counts[b] += 1;
        }
        if pooling.combiner == Combiner::Mean {
            for (b, &n) in counts.iter().enumerate().filter(|(_, &n)| n > 1) {
                for p in &mut out[(b * tables + t) * dim..][..dim] {
                    *p /= n as f32;
                }
            }
        }
        at += h;
    }
    Ok(())
}
