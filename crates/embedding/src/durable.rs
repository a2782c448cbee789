//! Durable updates: an append-only log per table, replayed at load and compacted into
//! new table files in the background.
//!
//! A table's log directory (`<table files>/updates/`, or `<update_log_dir>/<table>/`
//! for a table with no files) holds:
//! - `log.<gen>`: records appended by updates, each written and `fsync`ed before the
//!   update is applied and acknowledged;
//! - `base.<gen>/` (`keys.npy`, `vectors.npy`): a compaction's snapshot of the table;
//! - `MANIFEST`: `gen <g>`, written atomically once `base.<g>` is complete.
//!
//! Loading a table reads `base.<g>` when a MANIFEST says so (else the configured files),
//! then replays `log.<g>`, `log.<g+1>`, … in order. A torn last record (a crash in the
//! middle of an append, never acknowledged) is dropped and the file cut there.
//!
//! Record: `MAGIC u32 | payload length u32 | payload | crc32(payload) u32`, payload
//! `n u32 | dim u32 | n keys i64 | n × dim values f32`, all little-endian.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use triton_rust_core::error::{Error, Result};

use crate::table::{write_table, VectorType};

const MAGIC: u32 = 0x5550_4454;

/// Where replayed updates go: called with each record's keys and rows, in order.
pub type Apply<'a> = dyn FnMut(&[i64], &[f32]) -> Result<()> + 'a;
const HEADER: usize = 8;

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::internal(format!("update log: cannot {what} '{}': {e}", path.display()))
}

fn log_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("log.{gen}"))
}

/// The directory of a compaction's snapshot.
pub fn base_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("base.{gen}"))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("sync", dir, e))
}

/// The generation the MANIFEST names (its `base.<g>` replaces the configured files).
pub fn manifest_gen(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join("MANIFEST");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read", &path, e)),
    };
    text.trim().strip_prefix("gen ").and_then(|g| g.trim().parse().ok()).map(Some).ok_or_else(
        || {
            Error::internal(format!(
                "update log: '{}' is not a manifest ('gen <n>')",
                path.display()
            ))
        },
    )
}

/// Log generations present in `dir`, ascending.
fn generations(dir: &Path) -> Result<Vec<u64>> {
    let mut gens = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(gens),
        Err(e) => return Err(io("list", dir, e)),
    };
    for entry in entries.flatten() {
        if let Some(g) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("log."))
            .and_then(|g| g.parse().ok())
        {
            gens.push(g);
        }
    }
    gens.sort_unstable();
    Ok(gens)
}

/// Replays one log file; cuts a torn or corrupt tail. Returns (records, rows) applied.
fn replay_file(path: &Path, dim: usize, apply: &mut Apply<'_>) -> Result<(u64, u64)> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f.read_to_end(&mut bytes).map_err(|e| io("read", path, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(io("open", path, e)),
    };
    let (mut at, mut records, mut rows) = (0usize, 0u64, 0u64);
    while at + HEADER <= bytes.len() {
        let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let len = word(at + 4) as usize;
        let end = at + HEADER + len + 4;
        if word(at) != MAGIC || end > bytes.len() || len < 8 {
            break;
        }
        let payload = &bytes[at + HEADER..at + HEADER + len];
        if crc32fast::hash(payload) != word(at + HEADER + len) {
            break;
        }
        let n = u32::from_le_bytes(payload[0..4].try_into().expect("4")) as usize;
        let d = u32::from_le_bytes(payload[4..8].try_into().expect("4")) as usize;
        if d != dim || payload.len() != 8 + n * 8 + n * d * 4 {
            return Err(Error::internal(format!(
                "update log '{}': a record of dim {d} in a table of dim {dim}",
                path.display()
            )));
        }
        let keys: Vec<i64> = payload[8..8 + n * 8]
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8")))
            .collect();
        let vectors: Vec<f32> = payload[8 + n * 8..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        apply(&keys, &vectors)?;
        records += 1;
        rows += n as u64;
        at = end;
    }
    if at < bytes.len() {
        log::warn!(
            "update log '{}': dropping {} bytes of an unfinished last record (never acknowledged)",
            path.display(),
            bytes.len() - at
        );
        let f = OpenOptions::new().write(true).open(path).map_err(|e| io("open", path, e))?;
        f.set_len(at as u64).and_then(|()| f.sync_all()).map_err(|e| io("truncate", path, e))?;
    }
    Ok((records, rows))
}

/// One table's update log, open for appending.
pub struct UpdateLog {
    dir: PathBuf,
    dim: usize,
    gen: u64,
    file: Option<File>,
}

/// What loading a table found in its log directory.
pub struct Replayed {
    pub records: u64,
    pub rows: u64,
}

impl UpdateLog {
    /// The log of a table whose snapshot generation is `base_gen` (0 without a MANIFEST).
    /// Replays every log from `base_gen` on, in order, through `apply`. Creates nothing:
    /// the directory and file appear with the first append.
    pub fn recover(
        dir: &Path,
        dim: usize,
        base_gen: u64,
        apply: &mut Apply<'_>,
    ) -> Result<(UpdateLog, Replayed)> {
        let gens: Vec<u64> = generations(dir)?.into_iter().filter(|&g| g >= base_gen).collect();
        let mut replayed = Replayed { records: 0, rows: 0 };
        for &g in &gens {
            let (r, n) = replay_file(&log_path(dir, g), dim, apply)?;
            replayed.records += r;
            replayed.rows += n;
        }
        let gen = gens.last().copied().unwrap_or(base_gen);
        Ok((UpdateLog { dir: dir.to_path_buf(), dim, gen, file: None }, replayed))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn generation(&self) -> u64 {
        self.gen
    }

    fn file(&mut self) -> Result<&mut File> {
        if self.file.is_none() {
            std::fs::create_dir_all(&self.dir).map_err(|e| io("create", &self.dir, e))?;
            let path = log_path(&self.dir, self.gen);
            let existed = path.exists();
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| io("open", &path, e))?;
            if !existed {
                sync_dir(&self.dir)?;
            }
            self.file = Some(f);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    /// Appends one update and waits until it is on disk.
    pub fn append(&mut self, keys: &[i64], vectors: &[f32]) -> Result<()> {
        if vectors.len() != keys.len() * self.dim {
            return Err(Error::invalid_arg("update log: vectors do not match keys"));
        }
        let mut payload = Vec::with_capacity(8 + keys.len() * 8 + vectors.len() * 4);
        payload.extend_from_slice(&(keys.len() as u32).to_le_bytes());
        payload.extend_from_slice(&(self.dim as u32).to_le_bytes());
        payload.extend_from_slice(bytemuck::cast_slice(keys));
        payload.extend_from_slice(bytemuck::cast_slice(vectors));
        let mut record = Vec::with_capacity(HEADER + payload.len() + 4);
        record.extend_from_slice(&MAGIC.to_le_bytes());
        record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        record.extend_from_slice(&payload);
        record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        let path = log_path(&self.dir, self.gen);
        let f = self.file()?;
        f.write_all(&record).and_then(|()| f.sync_data()).map_err(|e| io("append to", &path, e))
    }

    /// Starts the next generation: later appends go to a new file. Returns its number.
    pub fn rotate(&mut self) -> Result<u64> {
        self.gen += 1;
        self.file = None;
        self.file()?;
        Ok(self.gen)
    }

    /// Replays one generation (a compaction brings the new snapshot up to date with it).
    pub fn replay(&self, gen: u64, apply: &mut Apply<'_>) -> Result<u64> {
        Ok(replay_file(&log_path(&self.dir, gen), self.dim, apply)?.1)
    }
}

/// Writes a snapshot as `base.<gen>` and makes it the table's base (MANIFEST), durably.
pub fn commit_base(
    dir: &Path,
    gen: u64,
    keys: &[i64],
    vectors: &[f32],
    dim: usize,
) -> Result<PathBuf> {
    let base = base_path(dir, gen);
    let _ = std::fs::remove_dir_all(&base);
    write_table(&base, keys, bytemuck::cast_slice(vectors), dim, VectorType::F32)?;
    for f in ["keys.npy", "vectors.npy"] {
        let p = base.join(f);
        File::open(&p).and_then(|f| f.sync_all()).map_err(|e| io("sync", &p, e))?;
    }
    sync_dir(&base)?;
    let tmp = dir.join("MANIFEST.tmp");
    let mut f = File::create(&tmp).map_err(|e| io("create", &tmp, e))?;
    f.write_all(format!("gen {gen}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io("write", &tmp, e))?;
    std::fs::rename(&tmp, dir.join("MANIFEST")).map_err(|e| io("rename", &tmp, e))?;
    sync_dir(dir)?;
    Ok(base)
}

/// Removes logs older than `gen` and snapshots other than `base.<gen>`.
pub fn remove_before(dir: &Path, gen: u64) {
    for g in generations(dir).unwrap_or_default() {
        if g < gen {
            let _ = std::fs::remove_file(log_path(dir, g));
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(g) = name.strip_prefix("base.").and_then(|g| g.parse::<u64>().ok()) {
                if g != gen {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trt-durable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    type Records = Vec<(Vec<i64>, Vec<f32>)>;

    fn collect(dir: &Path, dim: usize, base: u64) -> (UpdateLog, Records) {
        let mut seen = Vec::new();
        let (log, _) = UpdateLog::recover(dir, dim, base, &mut |k, v| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        (log, seen)
    }

    #[test]
    fn appends_replay_in_order_and_a_torn_tail_is_cut() {
        let dir = tmp("replay");
        let (mut log, seen) = collect(&dir, 2, 0);
        assert!(seen.is_empty() && !dir.exists(), "nothing is created before the first append");
        log.append(&[1, 2], &[1.0, 1.5, 2.0, 2.5]).unwrap();
        log.append(&[1], &[9.0, 9.5]).unwrap();
        drop(log);
        // a crash in the middle of a third append
        let path = log_path(&dir, 0);
        let good = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&[0x54, 0x44, 0x50, 0x55, 200, 0, 0, 0, 1, 2, 3])
            .unwrap();
        let (_, seen) = collect(&dir, 2, 0);
        assert_eq!(seen, vec![(vec![1, 2], vec![1.0, 1.5, 2.0, 2.5]), (vec![1], vec![9.0, 9.5])]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "the torn record is cut off");
        // a flipped byte inside a record stops the replay there
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (_, seen) = collect(&dir, 2, 0);
        assert_eq!(seen.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rotation_and_a_committed_base_decide_what_replays() {
        let dir = tmp("rotate");
        let (mut log, _) = collect(&dir, 1, 0);
        log.append(&[1], &[1.0]).unwrap();
        let g = log.rotate().unwrap();
        log.append(&[2], &[2.0]).unwrap();
        assert_eq!(manifest_gen(&dir).unwrap(), None);
        commit_base(&dir, g, &[1], &[1.0], 1).unwrap();
        remove_before(&dir, g);
        assert_eq!(manifest_gen(&dir).unwrap(), Some(g));
        assert!(!log_path(&dir, 0).exists() && base_path(&dir, g).join("keys.npy").exists());
        let (log, seen) = collect(&dir, 1, g);
        assert_eq!(
            seen,
            vec![(vec![2], vec![2.0])],
            "only the generation after the snapshot replays"
        );
        assert_eq!(log.generation(), g);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
