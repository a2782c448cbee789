//! Where a sharded store's rows live: a plan that places the tables over the memory of
//! several GPUs and routes each `(table, key)` to the GPU that holds its row. The routing is
//! the same for lookups and for updates, so an update reaches every copy of its row.
//!
//! `gpucache_placement: sharded` (`crate::store::sharded`) places the tables by this plan;
//! each GPU's lookup reads the tables it lacks from its peers' memory. Cutting one table into
//! row ranges over GPUs is planned here but not served (such a table is refused at load).
//!
//! Placement, in two steps:
//! 1. Tables are copied to every GPU (replicated), those with the most lookups a byte first,
//!    while their bytes together stay within the `replicate` bytes the caller allows. A lookup
//!    then reads them from its own GPU: DLRM-v2's 21 small tables are 2% of its rows but 30%
//!    of its lookups, and t20 alone (one of five tables of 40 M rows) is 47% of them.
//! 2. The others go largest first. A table goes whole to the GPU with the most room left,
//!    when it fits there. A table larger than any GPU's room is cut into ranges of rows, and
//!    each range fills the GPU with the most room left, until every row has a place.
//!
//! A table's rows are its keys `0..rows` (the resident tables' layout: row = key).

use std::ops::Range;

use triton_rust_core::error::{Error, Result};

/// One table to place: its rows, the bytes of one row, and the keys a sample looks up in it
/// (its hotness; what a copy on every GPU saves reading from a peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSize {
    pub rows: u64,
    pub row_bytes: u64,
    pub lookups: u64,
}

/// A range of a table's rows and the GPU that holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub rows: Range<u64>,
    pub gpu: i32,
}

/// Every table's shards, in row order, covering its rows once; or, for a table copied to
/// every GPU, one shard a GPU, each of every row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    tables: Vec<Vec<Shard>>,
    replicated: Vec<bool>,
    gpus: Vec<i32>,
}

impl ShardPlan {
    /// Places `tables` over `gpus`: `(device, bytes it may hold)`, each device once; at most
    /// `replicate` bytes of tables, the most lookups a byte first, are copied to every GPU
    /// (0: none).
    pub fn new(tables: &[TableSize], gpus: &[(i32, u64)], replicate: u64) -> Result<ShardPlan> {
        check_devices(&gpus.iter().map(|g| g.0).collect::<Vec<_>>())?;
        if let Some(t) = tables.iter().position(|t| t.row_bytes == 0) {
            return Err(Error::invalid_arg(format!("table {t}: rows of 0 bytes cannot be placed")));
        }
        let bytes = |t: usize| tables[t].rows * tables[t].row_bytes;
        let mut room: Vec<(i32, u64)> = gpus.to_vec();
        let mut order: Vec<usize> = (0..tables.len()).filter(|&t| tables[t].rows > 0).collect();
        // the most lookups a byte first (then the smaller, then table order), each copied to
        // every GPU where it fits the allowance, every GPU, and the room the other tables
        // need (each extra copy takes from the GPUs' room)
        order.sort_by(|&a, &b| {
            let per = |x: usize, y: usize| tables[x].lookups as u128 * bytes(y) as u128;
            per(b, a).cmp(&per(a, b)).then(bytes(a).cmp(&bytes(b))).then(a.cmp(&b))
        });
        let least = room.iter().map(|g| g.1).min().unwrap_or(0);
        let spare = room
            .iter()
            .map(|g| g.1)
            .sum::<u64>()
            .saturating_sub(order.iter().map(|&t| bytes(t)).sum());
        let extra = room.len() as u64 - 1;
        let mut copied = 0u64;
        let mut replicated = vec![false; tables.len()];
        for &t in &order {
            let more = copied + bytes(t);
            if tables[t].lookups == 0 || more > replicate.min(least) || more * extra > spare {
                continue;
            }
            copied += bytes(t);
            replicated[t] = true;
        }
        for g in room.iter_mut() {
            g.1 -= copied;
        }
        let mut placed: Vec<Vec<Shard>> = (0..tables.len())
            .map(|t| match replicated[t] {
                true => gpus.iter().map(|g| Shard { rows: 0..tables[t].rows, gpu: g.0 }).collect(),
                false => Vec::new(),
            })
            .collect();
        // then largest first; equal sizes in table order, so a plan is the same on every server
        order.retain(|&t| !replicated[t]);
        order.sort_by_key(|&t| (std::cmp::Reverse(bytes(t)), t));
        for t in order {
            let TableSize { rows, row_bytes, .. } = tables[t];
            let most = |room: &[(i32, u64)]| {
                (0..room.len()).max_by_key(|&i| (room[i].1, std::cmp::Reverse(i))).unwrap_or(0)
            };
            let whole = rows * row_bytes;
            let g = most(&room);
            if room[g].1 >= whole {
                room[g].1 -= whole;
                placed[t].push(Shard { rows: 0..rows, gpu: room[g].0 });
                continue;
            }
            let mut at = 0u64;
            while at < rows {
                let g = most(&room);
                let fit = (room[g].1 / row_bytes).min(rows - at);
                if fit == 0 {
                    let short = (rows - at) * row_bytes;
                    return Err(Error::invalid_arg(format!(
                        "table {t}: {} rows of {row_bytes} bytes do not fit the GPUs' room ({short} bytes short)",
                        rows
                    )));
                }
                room[g].1 -= fit * row_bytes;
                placed[t].push(Shard { rows: at..at + fit, gpu: room[g].0 });
                at += fit;
            }
            placed[t].sort_by_key(|s| s.rows.start);
        }
        Ok(ShardPlan { tables: placed, replicated, gpus: gpus.iter().map(|g| g.0).collect() })
    }

    /// The shards of table `t`, in row order (a replicated table's: one a GPU, in the
    /// plan's order of GPUs).
    pub fn shards(&self, t: usize) -> &[Shard] {
        self.tables.get(t).map_or(&[], Vec::as_slice)
    }

    /// Whether table `t` is copied to every GPU.
    pub fn replicated(&self, t: usize) -> bool {
        self.replicated.get(t).copied().unwrap_or(false)
    }

    /// The GPU whose copy of `key`'s row of table `t` a lookup on GPU `reader` reads: its
    /// own for a replicated table; `None` for a key that is no row.
    pub fn owner(&self, t: usize, key: i64, reader: i32) -> Option<i32> {
        let key = u64::try_from(key).ok()?;
        let shards = self.tables.get(t)?;
        if self.replicated(t) {
            return shards.iter().find(|s| s.gpu == reader && s.rows.contains(&key)).map(|s| s.gpu);
        }
        let i = shards.partition_point(|s| s.rows.end <= key);
        shards.get(i).filter(|s| s.rows.contains(&key)).map(|s| s.gpu)
    }

    /// `keys` of table `t` grouped by the GPU each is read from by a lookup on GPU `reader`:
    /// for each GPU of the plan (in its order), the positions of its keys in `keys`; then
    /// the positions of keys that are no row.
    pub fn route(
        &self,
        t: usize,
        keys: &[i64],
        reader: i32,
    ) -> (Vec<(i32, Vec<usize>)>, Vec<usize>) {
        let mut by: Vec<(i32, Vec<usize>)> = self.gpus.iter().map(|&g| (g, Vec::new())).collect();
        let mut none = Vec::new();
        for (i, &k) in keys.iter().enumerate() {
            match self.owner(t, k, reader).and_then(|g| by.iter_mut().find(|b| b.0 == g)) {
                Some(b) => b.1.push(i),
                None => none.push(i),
            }
        }
        (by, none)
    }

    /// `keys` of table `t` grouped by the GPUs an update must write them on: every copy of
    /// a row, so a replicated table's keys go to every GPU; then the keys that are no row.
    pub fn route_update(&self, t: usize, keys: &[i64]) -> (Vec<(i32, Vec<usize>)>, Vec<usize>) {
        let (mut by, none) = self.route(t, keys, self.gpus[0]);
        if self.replicated(t) {
            let first = by[0].1.clone();
            for b in by.iter_mut() {
                b.1.clone_from(&first);
            }
        }
        (by, none)
    }

    /// Bytes the plan puts on `gpu`.
    pub fn bytes_on(&self, gpu: i32, tables: &[TableSize]) -> u64 {
        self.tables
            .iter()
            .zip(tables)
            .flat_map(|(shards, size)| {
                shards
                    .iter()
                    .filter(move |s| s.gpu == gpu)
                    .map(move |s| (s.rows.end - s.rows.start) * size.row_bytes)
            })
            .sum()
    }
}

/// The devices a sharded store spans: at least two, each once.
pub fn check_devices(gpus: &[i32]) -> Result<()> {
    let mut seen = gpus.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != gpus.len() {
        return Err(Error::invalid_arg(format!("sharded rows name a GPU twice: {gpus:?}")));
    }
    if gpus.len() < 2 {
        return Err(Error::invalid_arg(format!(
            "sharded rows need KIND_GPU instances on at least two GPUs; this model has {gpus:?} (replicated placement serves one GPU)"
        )));
    }
    Ok(())
}

/// The GPUs a model's instance groups name, checked against the GPUs this process sees:
/// an error names the first that does not exist.
pub fn check_visible(gpus: &[i32], visible: i32) -> Result<()> {
    match gpus.iter().find(|&&g| g < 0 || g >= visible) {
        Some(g) => Err(Error::invalid_arg(format!(
            "the model names GPU {g}, but this server sees {visible} GPU{} (0..{})",
            if visible == 1 { "" } else { "s" },
            visible.max(1) - 1
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// DLRM-v2's 26 tables (MLPerf's rows and multi-hot sizes), dim 128 in fp32.
    fn dlrm_v2() -> Vec<TableSize> {
        const HOTNESS: [u64; 26] =
            [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1];
        [
            40_000_000u64,
            39060,
            17295,
            7424,
            20265,
            3,
            7122,
            1543,
            63,
            40_000_000,
            3067956,
            405282,
            10,
            2209,
            11938,
            155,
            4,
            976,
            14,
            40_000_000,
            40_000_000,
            40_000_000,
            590152,
            12973,
            108,
            36,
        ]
        .iter()
        .zip(HOTNESS)
        .map(|(&rows, lookups)| TableSize { rows, row_bytes: 512, lookups })
        .collect()
    }

    /// The GPU a lookup on `reader` reads `key` from, found by walking every shard (the
    /// reference the plan's search is held to): its own when it holds the row, else the one
    /// that does.
    fn walk(plan: &ShardPlan, t: usize, key: i64, reader: i32) -> Option<i32> {
        let holds = |s: &&Shard| key >= 0 && s.rows.contains(&(key as u64));
        let shards = plan.shards(t);
        shards
            .iter()
            .filter(holds)
            .find(|s| s.gpu == reader)
            .or(shards.iter().find(holds))
            .map(|s| s.gpu)
    }

    #[test]
    fn dlrm_v2_in_fp32_fits_two_gpus_that_one_cannot_hold() {
        let tables = dlrm_v2();
        let total: u64 = tables.iter().map(|t| t.rows * t.row_bytes).sum();
        assert_eq!(total, 104_542_509_056, "204,184,588 rows of 512 bytes");
        let gb = 1u64 << 30;
        assert!(
            ShardPlan::new(&tables, &[(0, 70 * gb), (1, 10 * gb)], 0).is_err(),
            "80 GiB cannot hold 97 GiB"
        );
        let plan = ShardPlan::new(&tables, &[(0, 70 * gb), (1, 70 * gb)], 0).unwrap();
        for (t, size) in tables.iter().enumerate() {
            let shards = plan.shards(t);
            // every row placed once, in order
            assert_eq!(shards.first().unwrap().rows.start, 0);
            assert_eq!(shards.last().unwrap().rows.end, size.rows);
            assert!(shards.windows(2).all(|w| w[0].rows.end == w[1].rows.start), "table {t}");
        }
        let (a, b) = (plan.bytes_on(0, &tables), plan.bytes_on(1, &tables));
        assert_eq!(a + b, total);
        assert!(a <= 70 * gb && b <= 70 * gb);
        // the five 40 M-row tables (20.5 GB each) go whole: three and two, the rest fill in
        let whole_on = |g| {
            (0..tables.len())
                .filter(|&t| tables[t].rows == 40_000_000 && plan.shards(t)[0].gpu == g)
                .count()
        };
        assert_eq!(whole_on(0) + whole_on(1), 5);
        assert!(
            (a as i64 - b as i64).unsigned_abs() <= 21 * gb,
            "balanced within a big table: {a} {b}"
        );
    }

    #[test]
    fn a_table_larger_than_any_gpu_is_cut_into_row_ranges() {
        let tables = [
            TableSize { rows: 1000, row_bytes: 8, lookups: 1 },
            TableSize { rows: 10, row_bytes: 8, lookups: 1 },
        ];
        let plan = ShardPlan::new(&tables, &[(3, 4000), (5, 4400)], 0).unwrap();
        assert_eq!(
            plan.shards(0),
            &[Shard { rows: 0..550, gpu: 5 }, Shard { rows: 550..1000, gpu: 3 }]
        );
        assert_eq!(plan.shards(1), &[Shard { rows: 0..10, gpu: 3 }]);
        assert_eq!(plan.owner(0, 549, 3), Some(5));
        assert_eq!(plan.owner(0, 550, 3), Some(3));
        assert_eq!(plan.owner(0, 1000, 3), None);
        assert_eq!(plan.owner(0, -1, 3), None);
        assert_eq!(plan.owner(7, 0, 3), None, "no such table");
    }

    #[test]
    fn lookups_and_updates_route_to_the_shard_that_holds_the_row() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut rounds_copying = 0;
        for round in 0..100 {
            let n = rng.gen_range(1..12);
            let tables: Vec<TableSize> = (0..n)
                .map(|_| TableSize {
                    rows: rng.gen_range(0..5000),
                    row_bytes: 4 * rng.gen_range(1..64),
                    lookups: rng.gen_range(0..4),
                })
                .collect();
            let total: u64 = tables.iter().map(|t| t.rows * t.row_bytes).sum();
            let gpus: Vec<(i32, u64)> =
                (0..rng.gen_range(2..5)).map(|g| (g, total / 2 + rng.gen_range(0..1000))).collect();
            // half the rounds copy up to a tenth of the rows to every GPU
            let replicate = if round % 2 == 0 { 0 } else { total / 10 };
            let plan = ShardPlan::new(&tables, &gpus, replicate).unwrap();
            let mut copied = 0;
            for (t, size) in tables.iter().enumerate() {
                if plan.replicated(t) {
                    copied += size.rows * size.row_bytes;
                    assert_eq!(plan.shards(t).len(), gpus.len(), "round {round}: a copy a GPU");
                }
            }
            assert!(
                copied <= replicate,
                "round {round}: {copied} bytes copied, {replicate} allowed"
            );
            rounds_copying += (copied > 0) as usize;
            for (g, cap) in &gpus {
                assert!(plan.bytes_on(*g, &tables) <= *cap, "round {round}: GPU {g} over its room");
            }
            for (t, size) in tables.iter().enumerate() {
                let keys: Vec<i64> =
                    (0..200).map(|_| rng.gen_range(-3..size.rows as i64 + 3)).collect();
                for &(reader, _) in &gpus {
                    let (by, none) = plan.route(t, &keys, reader);
                    let mut seen = vec![0; keys.len()];
                    for (g, at) in &by {
                        for &i in at {
                            let want = walk(&plan, t, keys[i], reader);
                            assert_eq!(want, Some(*g), "round {round} table {t} key {}", keys[i]);
                            seen[i] += 1;
                        }
                    }
                    for &i in &none {
                        assert_eq!(walk(&plan, t, keys[i], reader), None);
                        seen[i] += 1;
                    }
                    assert!(seen.iter().all(|&s| s == 1), "every key routed once");
                }
                // an update reaches every shard holding its row, and only those
                let (by, none) = plan.route_update(t, &keys);
                for (g, at) in &by {
                    for (i, &k) in keys.iter().enumerate() {
                        let holds = plan
                            .shards(t)
                            .iter()
                            .any(|s| s.gpu == *g && k >= 0 && s.rows.contains(&(k as u64)));
                        assert_eq!(
                            at.contains(&i),
                            holds,
                            "round {round} table {t} GPU {g} key {k}"
                        );
                    }
                }
                for &i in &none {
                    assert!(walk(&plan, t, keys[i], gpus[0].0).is_none());
                }
            }
        }
        assert!(rounds_copying >= 10, "{rounds_copying} rounds copied tables to every GPU");
    }

    #[test]
    fn dlrm_v2s_small_tables_are_copied_to_every_gpu_and_its_large_ones_placed_whole() {
        let tables = dlrm_v2();
        let gb = 1u64 << 30;
        let room = [(0, 62 * gb), (1, 64 * gb)];
        let plan = ShardPlan::new(&tables, &room, 4 * gb).unwrap();
        for (t, size) in tables.iter().enumerate() {
            // every table but the five of 40 M rows (2.1 GB together at fp32)
            assert_eq!(plan.replicated(t), size.rows < 40_000_000, "table {t}");
        }
        let big_on = |g| {
            (0..tables.len()).filter(|&t| !plan.replicated(t) && plan.shards(t)[0].gpu == g).count()
        };
        assert_eq!((big_on(0), big_on(1)), (2, 3), "the GPU with more room takes the first");
        let small: u64 =
            tables.iter().filter(|t| t.rows < 40_000_000).map(|t| t.rows * t.row_bytes).sum();
        assert_eq!(plan.bytes_on(1, &tables), small + 3 * 40_000_000 * 512);
        // a lookup of a small table reads its own GPU's copy; of a large one, the holder's
        assert_eq!(plan.owner(10, 5, 0), Some(0));
        assert_eq!(plan.owner(10, 5, 1), Some(1));
        let holder = plan.shards(20)[0].gpu;
        assert_eq!((plan.owner(20, 7, 0), plan.owner(20, 7, 1)), (Some(holder), Some(holder)));
        // with room for more, t20 (100 of the 214 lookups a pair) is copied next, before the
        // other tables of 40 M rows, and those four are placed two a GPU
        let room = [(0, 67 * gb), (1, 67 * gb)];
        let hot = ShardPlan::new(&tables, &room, 25 * gb).unwrap();
        let copied: Vec<usize> = (0..tables.len()).filter(|&t| hot.replicated(t)).collect();
        assert_eq!(copied.len(), 22);
        assert!(hot.replicated(20) && !hot.replicated(21), "{copied:?}");
        let big_on = |g| {
            (0..tables.len()).filter(|&t| !hot.replicated(t) && hot.shards(t)[0].gpu == g).count()
        };
        assert_eq!((big_on(0), big_on(1)), (2, 2));
        // a table no sample looks up is never copied
        let mut cold = tables.clone();
        cold[1].lookups = 0;
        assert!(!ShardPlan::new(&cold, &room, 25 * gb).unwrap().replicated(1));
        // an allowance smaller than the smallest table copies nothing
        let none = ShardPlan::new(&tables, &room, 10).unwrap();
        assert!((0..tables.len()).all(|t| !none.replicated(t)));
    }

    #[test]
    fn devices_are_checked_with_clear_errors() {
        let one = check_devices(&[0]).unwrap_err();
        assert!(
            one.message().contains("at least two GPUs") && one.message().contains("[0]"),
            "{one}"
        );
        assert!(check_devices(&[1, 1]).unwrap_err().message().contains("twice"));
        assert!(check_devices(&[0, 1]).is_ok());
        let e = check_visible(&[0, 3], 2).unwrap_err();
        assert!(e.message().contains("GPU 3") && e.message().contains("sees 2 GPUs"), "{e}");
        assert!(check_visible(&[0, 1], 2).is_ok());
        assert!(check_visible(&[0], 0).unwrap_err().message().contains("sees 0 GPUs"));
    }
}
