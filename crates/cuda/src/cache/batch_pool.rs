//! A batch lookup that pools as it looks up ([`BatchLookup::set_pooling`]): keys of fixed
//! hotness as sent, in GPU memory, are probed in the caches (`probe_slots`: each key's slot,
//! 8 bytes a key) and each bag's hits summed straight from those slots (`pool_probe`), the two
//! kernels one after the other on the caches' queue, so no fill can move a row between them and
//! no hit's row is ever written out and read back; the bags that missed are closed once their rows
//! are up, by adding those rows (`pool_mark_misses`, `pool_close`, on this lookup's stream),
//! where the rows path scatters them. A bag's sum is its hits' rows in key order, then its
//! misses' rows in key order, in fp32: equal to the rows path's key-order sum within fp32
//! rounding, and the same for the same hits and misses every time.

use cudarc::driver::PushKernelArg;

use super::{BatchKeys, BatchLookup, KeyLayout, RowFormat};
use crate::buffer::{DeviceMem, DevicePtr};
use crate::context::cuda_err;
use crate::copy::{dtod_on, dtoh, zero};
use crate::error::{CudaError, Result};
use crate::kernels::{lookup_keys_per_warp, threads_config, warps_config, PROBE_STEPS};
use crate::mem::DeviceView;

/// How a pooling lookup reduces each bag, the type it writes the pooled rows in, and whether
/// it reads a row missed by several keys of a batch once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// Each bag's sum divided by its count.
    pub mean: bool,
    pub format: RowFormat,
    /// The misses made distinct on the GPU before they go down (`dedupe_misses`): the fetcher
    /// reads, and the fill inserts, each missed (table, key) of a batch once; the keys that
    /// repeat it take its row (`pool_mark_repeats`).
    pub once: bool,
}

/// A pooling lookup's wish and what it keeps from run to run.
pub(super) struct PoolRun {
    wanted: Option<PoolSpec>,
    /// The run under way (or the last) pools: `(batch, width)`.
    pub(super) active: Option<(usize, usize)>,
    /// Per key, its slot (-1: a miss) and its fetched row once marked (-1: a hit); per bag,
    /// whether it missed; the open bags' sums of hits (fp32); the pooled rows.
    slots: DeviceMem,
    pos: DeviceMem,
    open: DeviceMem,
    partial: DeviceMem,
    out: DeviceMem,
    /// Making the misses distinct (`once`): the owners' table, the distinct misses, the
    /// repeats as (index, owner's index), the two counts; the last run's repeats.
    owners: DeviceMem,
    uniq: DeviceMem,
    dups: DeviceMem,
    counts: DeviceMem,
    repeats: usize,
    /// Per key index, how many of the last run's misses its row stands for (`once`), for the
    /// fill's LFU count; `counted`: the last run's miss list is distinct and `mult` holds them.
    mult: DeviceMem,
    counted: bool,
}

impl PoolRun {
    pub(super) fn new(device: i32) -> PoolRun {
        PoolRun {
            wanted: None,
            active: None,
            slots: DeviceMem::growing(device),
            pos: DeviceMem::growing(device),
            open: DeviceMem::growing(device),
            partial: DeviceMem::growing(device),
            out: DeviceMem::growing(device),
            owners: DeviceMem::growing(device),
            uniq: DeviceMem::growing(device),
            dups: DeviceMem::growing(device),
            counts: DeviceMem::growing(device),
            repeats: 0,
            mult: DeviceMem::growing(device),
            counted: false,
        }
    }

    /// A run begins: no misses made distinct yet.
    pub(super) fn new_run(&mut self) {
        self.repeats = 0;
        self.counted = false;
    }

    /// The fill's LFU count's multiplicities: the device address of `mult` when the last
    /// run's miss list was made distinct, else 0 (each listed miss counted once).
    pub(super) fn mult_for_fill(&self) -> u64 {
        if self.counted {
            self.mult.ptr().raw()
        } else {
            0
        }
    }
}

/// Threads a bag, each holding 16 bytes of a row of `dim` elements of `format`: `None` unless
/// a row is whole 16-byte pieces, and (for the probe, `pow2`) their count a power of two up
/// to 32, so a bag's lanes are one aligned group of a warp.
fn lanes(dim: usize, format: RowFormat, pow2: bool) -> Option<usize> {
    let bytes = dim * format.size();
    let lanes = bytes / 16;
    let fits = bytes.is_multiple_of(16)
        && lanes > 0
        && (!pow2 || (lanes.is_power_of_two() && lanes <= 32));
    fits.then_some(lanes)
}

impl BatchLookup {
    /// Whether the next runs pool (`Some`): a run over keys of fixed hotness already in GPU
    /// memory (`KeyLayout::Fixed`, `BatchKeys::Device`), with the misses read by the fetcher
    /// and the rows in this lookup's own buffer, then hands `[batch, tables, dim]` pooled
    /// rows ([`BatchLookup::pooled`]) and no rows; any other run, or rows whose 16-byte
    /// pieces do not make one group of a warp, looks its rows up as before.
    pub fn set_pooling(&mut self, spec: Option<PoolSpec>) {
        self.pool.wanted = spec;
    }

    /// The last run's pooled rows, when it pooled (complete; valid until the next run).
    pub fn pooled(&self) -> Option<DeviceView<'_>> {
        let (batch, _) = self.pool.active?;
        let spec = self.pool.wanted?;
        self.pool.out.view(batch * self.tables * self.dim * spec.format.size())
    }

    /// Whether a run over `keys` laid out as `layout` pools, and then its `(batch, width)`:
    /// fixed hotness, keys in GPU memory, rows into this lookup's own buffer (`own_out`).
    pub(super) fn pools(
        &self,
        keys: &BatchKeys<'_>,
        layout: KeyLayout<'_>,
        own_out: bool,
    ) -> Option<(usize, usize)> {
        let KeyLayout::Fixed { width, .. } = layout else { return None };
        let ok = self.pool.wanted.is_some()
            && matches!(keys, BatchKeys::Device(_))
            && own_out
            && !self.host_on
            && lanes(self.dim, self.stored, true).is_some()
            && lanes(self.dim, self.fetched_as, false).is_some();
        ok.then_some((keys.len() / width.max(1), width))
    }

    /// The keys (`n`, in GPU memory at `src`) copied into this lookup's buffer and the probe
    /// queued behind them on the caches' queue: each key's slot found and the misses listed
    /// (`probe_index` through the caches' key indexes, or `probe_slots` reading sets' tags),
    /// then each bag's hits summed from their slots (`pool_probe`).
    pub(super) fn probe_pool(&mut self, src: DevicePtr<'_>, n: usize, epoch: u64) -> Result<()> {
        let (Some((batch, width)), Some(spec)) = (self.pool.active, self.pool.wanted) else {
            return Ok(());
        };
        let (tables, dim) = (self.tables, self.dim);
        let bags = batch * tables;
        let p = &mut self.pool;
        p.slots.reserve(n * 8)?;
        p.pos.reserve(n * 4)?;
        p.open.reserve(bags)?;
        p.partial.reserve(bags * dim * 4)?;
        p.out.reserve(bags * dim * spec.format.size())?;
        let q = &self.queue;
        let d_keys = self.keys.1.ptr();
        // `src` holds n keys (checked by `run_keys`) and stays valid through this run, which
        // waits on the queue; the copy is ordered before the probe and any later fill
        dtod_on(&q.stream, d_keys, src, n * 8)?;
        let lanes = lanes(dim, self.stored, true).expect("checked by `pools`");
        let k = &self.kernels;
        let f = match (self.stored, spec.format) {
            (RowFormat::F32, RowFormat::F32) => &k.pool_probe,
            (RowFormat::F32, RowFormat::F16) => &k.pool_probe_h,
            (RowFormat::F16, RowFormat::F32) => &k.s16.pool_probe,
            (RowFormat::F16, RowFormat::F16) => &k.s16.pool_probe_h,
        };
        let (n_i, batch_i, width_i, tables_i, dim_i, lanes_i, mean_i) = (
            n as i32,
            batch as i32,
            width as i32,
            tables as i32,
            dim as i32,
            lanes as i32,
            i32::from(spec.mean),
        );
        let (d_at, d_desc) = (self.starts.1.ptr(), self.desc.ptr());
        let (d_slots, d_out, d_partial, d_pos, d_open) =
            (p.slots.ptr(), p.out.ptr(), p.partial.ptr(), p.pos.ptr(), p.open.ptr());
        let (d_miss, d_count) = (self.miss.1.ptr(), self.count.1.ptr());
        // through the key indexes when every cache has one (a resident table needs none)
        let indexed = self._slots.iter().filter(|s| s.fields[3] > 0).all(|s| s.fields[8] != 0);
        let (probe, grid) = if indexed {
            (&k.probe_index, threads_config(n))
        } else {
            (&k.probe_slots, warps_config(n.div_ceil(lookup_keys_per_warp() * PROBE_STEPS)))
        };
        let mut a = q.stream.launch_builder(probe);
        a.arg(&d_keys).arg(&n_i).arg(&width_i).arg(&tables_i).arg(&d_at).arg(&d_desc);
        a.arg(&epoch).arg(&d_slots).arg(&d_pos).arg(&d_miss).arg(&d_count);
        // SAFETY: argument types and order match probe_slots and probe_index (the same); the
        // keys hold n = batch * width keys, the starts (`place_layout`) tables + 1, the
        // descriptors name slots `_slots` holds (an index of as many keys as they say), slots
        // and pos were sized above for n keys and the miss list holds n.
        unsafe { a.launch(grid) }.map_err(cuda_err)?;
        let mut b = q.stream.launch_builder(f);
        b.arg(&d_slots).arg(&batch_i).arg(&width_i).arg(&tables_i).arg(&d_at).arg(&d_desc);
        b.arg(&dim_i).arg(&lanes_i).arg(&mean_i).arg(&d_out).arg(&d_partial).arg(&d_open);
        // SAFETY: argument types and order match pool_probe(_h)(_s16), the one for the
        // caches' rows and the pooled rows' format; the slots (written just before on this
        // queue) hold n keys' slots, every buffer was sized above for batch * tables bags.
        unsafe { b.launch(threads_config(bags * lanes)) }.map_err(cuda_err)?;
        Ok(())
    }

    /// A pooling run's `m` misses among its `n` keys (the probe's list, on the GPU) made
    /// distinct when its spec says `once`: the list becomes the first miss of each (table,
    /// key), in no order, the others are kept for `close_bags` to give their owner's row, and
    /// each row's count of misses for the fill's LFU count. Returns how many the list holds
    /// now (`m` when not pooling, or not `once`).
    pub(super) fn distinct_misses(&mut self, n: usize, m: usize) -> Result<usize> {
        // the run's start (`new_run`) left no repeats and nothing counted
        let (Some((_, width)), Some(spec)) = (self.pool.active, self.pool.wanted) else {
            return Ok(m);
        };
        if !spec.once || m < 2 {
            return Ok(m);
        }
        let cap = (2 * m).next_power_of_two();
        let p = &mut self.pool;
        p.owners.reserve(cap * 4)?;
        p.uniq.reserve(m * 4)?;
        p.dups.reserve(m * 8)?;
        p.counts.reserve(8)?;
        p.mult.reserve(n * 4)?;
        // after `count_misses`: this stream already waits for the probe that listed them, and
        // the queue for the last fill, which read `mult`
        let q = &self.own;
        zero(q, p.owners.ptr(), cap * 4)?;
        zero(q, p.counts.ptr(), 8)?;
        zero(q, p.mult.ptr(), n * 4)?;
        let (d_keys, d_miss, d_at) = (self.keys.1.ptr(), self.miss.1.ptr(), self.starts.1.ptr());
        let (d_owners, d_uniq, d_dups, d_counts, d_mult) =
            (p.owners.ptr(), p.uniq.ptr(), p.dups.ptr(), p.counts.ptr(), p.mult.ptr());
        let (m_i, width_i, tables_i, cap_i) =
            (m as i32, width as i32, self.tables as i32, cap as i64);
        let mut b = q.stream.launch_builder(&self.kernels.dedupe_misses);
        b.arg(&d_keys).arg(&d_miss).arg(&m_i).arg(&width_i).arg(&tables_i).arg(&d_at);
        b.arg(&d_owners).arg(&cap_i).arg(&d_uniq).arg(&d_dups).arg(&d_counts).arg(&d_mult);
        // SAFETY: argument types and order match dedupe_misses; the m indices are keys of
        // this run (< n, which the keys and `mult` hold), the starts hold tables + 1, the
        // owners' table has cap (a power of two, zeroed) places, uniq and dups room for m
        // entries each.
        unsafe { b.launch(threads_config(m)) }.map_err(cuda_err)?;
        let h = self.count.0.slice(2)?;
        dtoh(q, h, d_counts)?;
        q.wait()?;
        let (distinct, repeats) = (h[0] as usize, h[1] as usize);
        if distinct + repeats != m || distinct == 0 {
            return Err(CudaError::internal(format!(
                "{m} misses made distinct gave {distinct} distinct and {repeats} repeats"
            )));
        }
        // the distinct misses become the list the fetcher, the close and the fill read
        dtod_on(&q.stream, d_miss, d_uniq, distinct * 4)?;
        self.pool.repeats = repeats;
        self.pool.counted = true;
        Ok(distinct)
    }

    /// The open bags closed with the `m` fetched rows (on the GPU, in the fetcher's order, as
    /// the miss list on the GPU is): each missed key told its row, then each open bag's
    /// missed rows added, on this lookup's stream.
    pub(super) fn close_bags(&mut self, m: usize) -> Result<()> {
        let (Some((batch, width)), Some(spec)) = (self.pool.active, self.pool.wanted) else {
            return Ok(());
        };
        let (q, p) = (&self.own, &self.pool);
        let (d_miss, d_pos, m_i) = (self.miss.1.ptr(), p.pos.ptr(), m as i32);
        let mut b = q.stream.launch_builder(&self.kernels.pool_mark);
        b.arg(&d_miss).arg(&m_i).arg(&d_pos);
        // SAFETY: argument types and order match pool_mark_misses; the m indices are keys of
        // this run, which `pos` has room for.
        unsafe { b.launch(threads_config(m)) }.map_err(cuda_err)?;
        if p.repeats > 0 {
            let (d_dups, d_i) = (p.dups.ptr(), p.repeats as i32);
            let mut r = q.stream.launch_builder(&self.kernels.pool_mark_repeats);
            r.arg(&d_dups).arg(&d_i).arg(&d_pos);
            // SAFETY: argument types and order match pool_mark_repeats; `distinct_misses`
            // listed `repeats` pairs of this run's key indices, which `pos` has room for.
            unsafe { r.launch(threads_config(p.repeats)) }.map_err(cuda_err)?;
        }
        let lanes = lanes(self.dim, self.fetched_as, false).expect("checked by `pools`");
        let which = match (self.fetched_as, spec.format) {
            (RowFormat::F32, RowFormat::F32) => 0,
            (RowFormat::F32, RowFormat::F16) => 1,
            (RowFormat::F16, RowFormat::F32) => 2,
            (RowFormat::F16, RowFormat::F16) => 3,
        };
        let (tables, bags) = (self.tables as i32, batch * self.tables);
        let (batch_i, width_i, dim_i, lanes_i, mean_i) =
            (batch as i32, width as i32, self.dim as i32, lanes as i32, i32::from(spec.mean));
        // fp32 rows fetched for caches of fp16 rows: each rounded as the caches round a row
        // that goes in, so a bag's sum does not depend on which of its keys hit
        let round16 = i32::from(self.stored == RowFormat::F16 && self.fetched_as == RowFormat::F32);
        let (d_rows, d_open, d_at) = (self.fetched.1.ptr(), p.open.ptr(), self.starts.1.ptr());
        let (d_partial, d_out) = (p.partial.ptr(), p.out.ptr());
        let mut c = q.stream.launch_builder(&self.kernels.pool_close[which]);
        c.arg(&d_rows).arg(&d_pos).arg(&d_open).arg(&batch_i).arg(&width_i).arg(&tables);
        c.arg(&d_at).arg(&dim_i).arg(&lanes_i).arg(&mean_i);
        c.arg(&round16).arg(&d_partial).arg(&d_out);
        // SAFETY: argument types and order match pool_close(_h)(_r16), the one for the
        // fetched rows' type and the pooled rows' format; the fetched rows are m rows of dim
        // (every `pos` ≥ 0 is one of them), and the bags' buffers were sized by the probe.
        unsafe { c.launch(threads_config(bags * lanes)) }.map_err(cuda_err)?;
        Ok(())
    }
}
