//! Embedding tables on disk.
//!
//! Our format (docs/embedding-store.md): one directory per table holding
//! `keys.npy` (int64, shape `[rows]`) and `vectors.npy` (float32 or float16, shape
//! `[rows, dim]`), little-endian, C order — readable by numpy, written by any tool,
//! and memory-mapped here rather than copied. HugeCTR/HPS sparse model folders (raw
//! `key` int64 and `emb_vector` float32 files) are read the same way and can be
//! converted with [`import_hugectr`].

use std::path::Path;

use triton_rust_core::error::{Error, Result};
use triton_rust_os::{HugeCopy, MappedFile};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorType {
    F32,
    F16,
}

impl VectorType {
    pub fn size(self) -> usize {
        match self {
            VectorType::F32 => 4,
            VectorType::F16 => 2,
        }
    }
    fn npy_descr(self) -> &'static str {
        match self {
            VectorType::F32 => "<f4",
            VectorType::F16 => "<f2",
        }
    }
}

/// A parsed `.npy` header: element descriptor, shape, and where the data starts.
#[derive(Debug, PartialEq)]
pub struct NpyHeader {
    pub descr: String,
    pub shape: Vec<usize>,
    pub data_offset: usize,
}

fn header_field<'a>(dict: &'a str, key: &str) -> Option<&'a str> {
    let at = dict.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = dict[at..].trim_start().strip_prefix(':')?.trim_start();
    Some(rest)
}

/// Parses the header of an `.npy` file (format versions 1–3).
pub fn parse_npy_header(bytes: &[u8]) -> Result<NpyHeader> {
    let bad = |why: &str| Error::invalid_arg(format!("not a .npy file: {why}"));
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("missing magic"));
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        v => return Err(bad(&format!("unsupported version {v}"))),
    };
    let dict =
        std::str::from_utf8(bytes.get(start..start + len).ok_or_else(|| bad("truncated header"))?)
            .map_err(|_| bad("header is not text"))?;
    let descr = header_field(dict, "descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("no descr"))?
        .to_string();
    if header_field(dict, "fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err(bad("Fortran order is not supported; save with C order"));
    }
    let shape_text = header_field(dict, "shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad("bad shape")))
        .collect::<Result<Vec<_>>>()?;
    Ok(NpyHeader { descr, shape, data_offset: start + len })
}

/// The header of an `.npy` file (version 1) whose data starts 64-byte aligned after it.
pub fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let shape_text = match shape {
        [n] => format!("({n},)"),
        dims => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out
}

/// Writes an `.npy` file (version 1, data aligned to 64 bytes).
pub fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> Result<()> {
    let mut out = npy_header(descr, shape);
    out.extend_from_slice(data);
    std::fs::write(path, out)
        .map_err(|e| Error::internal(format!("cannot write '{}': {e}", path.display())))
}

/// One value as type `t` stores it (its little-endian bytes).
pub fn encode_value(t: VectorType, v: f32) -> Vec<u8> {
    match t {
        VectorType::F32 => v.to_le_bytes().to_vec(),
        VectorType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
    }
}

/// Where a table's vectors are read from.
enum Vectors {
    /// The file's mapping (`range` of it).
    Mapped { file: MappedFile, range: std::ops::Range<usize> },
    /// A copy in memory backed by huge pages (`HostRows::HugePages`).
    Copied(HugeCopy),
}

/// Where the host tier keeps the rows of tables loaded from files: a store's
/// `host_memory` parameter (`auto`, the default, `mapped` or `huge_pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostRows {
    /// `HugePages` where the host offers transparent huge pages (`always` or `madvise`) and
    /// the copy leaves a tenth of its memory (at least 4 GiB) available; `Mapped`
    /// otherwise, the reason logged (`triton_rust_os::huge_copy_refused`). Decided table by
    /// table at load, each copy counting against the next.
    #[default]
    Auto,
    /// Read in place from the file's mapping (no copy; the first read of a page maps it,
    /// and the store maps them all at load).
    Mapped,
    /// Copied at load into anonymous memory the kernel backs with 2 MiB pages: one more
    /// copy of the rows in RAM (the file's pages may stay cached too), and reads of rows
    /// scattered over a large table that miss the TLB far less often (`examples/
    /// miss_reads_bench.rs` and `bench/gpu/cache_runs.sh` measure both on the GPU machine).
    HugePages,
}

/// As a model parameter's text (`parse`).
impl std::str::FromStr for HostRows {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<HostRows, String> {
        HostRows::parse(s).map_err(|e| e.message().to_string())
    }
}

impl HostRows {
    pub fn parse(s: &str) -> Result<HostRows> {
        match s.trim() {
            "" | "auto" => Ok(HostRows::Auto),
            "mapped" => Ok(HostRows::Mapped),
            "huge_pages" => Ok(HostRows::HugePages),
            other => Err(Error::invalid_arg(format!(
                "host_memory must be auto, mapped or huge_pages; got '{other}'"
            ))),
        }
    }
}

/// One table's keys and vectors, memory-mapped (the vectors possibly copied, see `HostRows`).
pub struct TableFiles {
    keys_file: MappedFile,
    keys_range: std::ops::Range<usize>,
    vectors: Vectors,
    pub rows: usize,
    pub dim: usize,
    pub vector_type: VectorType,
}

impl TableFiles {
    /// Opens a table in our format: `<dir>/keys.npy` and `<dir>/vectors.npy`.
    pub fn open_npy(dir: &Path) -> Result<TableFiles> {
        let keys_path = dir.join("keys.npy");
        let vectors_path = dir.join("vectors.npy");
        let keys_file = MappedFile::open(&keys_path)?;
        let vectors_file = MappedFile::open(&vectors_path)?;
        let kh = parse_npy_header(keys_file.bytes()).map_err(|e| e.context(keys_path.display()))?;
        let vh = parse_npy_header(vectors_file.bytes())
            .map_err(|e| e.context(vectors_path.display()))?;
        if kh.descr != "<i8" || kh.shape.len() != 1 {
            return Err(Error::invalid_arg(format!(
                "'{}' must hold int64 keys of shape [rows]; it has {} {:?}",
                keys_path.display(),
                kh.descr,
                kh.shape
            )));
        }
        let vector_type = match vh.descr.as_str() {
            "<f4" => VectorType::F32,
            "<f2" => VectorType::F16,
            other => {
                return Err(Error::invalid_arg(format!(
                    "'{}' must hold float32 or float16 vectors; it has {other}",
                    vectors_path.display()
                )))
            }
        };
        let rows = kh.shape[0];
        if vh.shape.len() != 2 || vh.shape[0] != rows {
            return Err(Error::invalid_arg(format!(
                "'{}' has shape {:?}; expected [{rows}, dim] to match {} keys",
                vectors_path.display(),
                vh.shape,
                rows
            )));
        }
        let dim = vh.shape[1];
        Self::checked(
            keys_file,
            kh.data_offset,
            vectors_file,
            vh.data_offset,
            rows,
            dim,
            vector_type,
            dir,
        )
    }

    /// Opens a HugeCTR/HPS sparse model folder: raw `key` (int64) and `emb_vector`
    /// (float32, `dim` per key) files.
    pub fn open_hugectr(dir: &Path, dim: usize) -> Result<TableFiles> {
        if dim == 0 {
            return Err(Error::invalid_arg("embedding dim must be positive"));
        }
        let keys_file = MappedFile::open(&dir.join("key"))?;
        let vectors_file = MappedFile::open(&dir.join("emb_vector"))?;
        if keys_file.bytes().len() % 8 != 0 {
            return Err(Error::invalid_arg(format!(
                "'{}/key' is not a whole number of int64 keys",
                dir.display()
            )));
        }
        let rows = keys_file.bytes().len() / 8;
        if vectors_file.bytes().len() != rows * dim * 4 {
            return Err(Error::invalid_arg(format!(
                "'{}/emb_vector' holds {} bytes; {rows} keys of dim {dim} need {}",
                dir.display(),
                vectors_file.bytes().len(),
                rows * dim * 4
            )));
        }
        Self::checked(keys_file, 0, vectors_file, 0, rows, dim, VectorType::F32, dir)
    }

    #[allow(clippy::too_many_arguments)]
    fn checked(
        keys_file: MappedFile,
        keys_at: usize,
        vectors_file: MappedFile,
        vectors_at: usize,
        rows: usize,
        dim: usize,
        vector_type: VectorType,
        dir: &Path,
    ) -> Result<TableFiles> {
        let keys_range = keys_at..keys_at + rows * 8;
        let vectors_range = vectors_at..vectors_at + rows * dim * vector_type.size();
        if keys_file.bytes().len() < keys_range.end
            || vectors_file.bytes().len() < vectors_range.end
        {
            return Err(Error::invalid_arg(format!(
                "table files in '{}' are truncated",
                dir.display()
            )));
        }
        if !keys_at.is_multiple_of(8) || !vectors_at.is_multiple_of(vector_type.size()) {
            return Err(Error::invalid_arg(format!(
                "table files in '{}' have misaligned data",
                dir.display()
            )));
        }
        Ok(TableFiles {
            keys_file,
            keys_range,
            vectors: Vectors::Mapped { file: vectors_file, range: vectors_range },
            rows,
            dim,
            vector_type,
        })
    }

    pub fn keys(&self) -> &[i64] {
        bytemuck::cast_slice(&self.keys_file.bytes()[self.keys_range.clone()])
    }

    /// Puts the rows where `how` says, before they are served: mapped, every page of the
    /// rows is mapped into this process now (see `MappedFile::populate`), so a first read
    /// of a row does not wait on a page fault; `HugePages` copies them (see `HostRows`).
    /// Logged when it takes a while; when the kernel refuses (no `MADV_POPULATE_READ`
    /// before Linux 5.14, no memory for the copy) the rows stay as they were, logged.
    pub fn place(self, name: &str, how: HostRows) -> TableFiles {
        let t0 = std::time::Instant::now();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16);
        let gb = self.vector_bytes().len() as f64 / 1e9;
        let slow = |what: &str| {
            if t0.elapsed().as_secs_f64() >= 1.0 {
                log::info!(
                    "table '{name}': {gb:.1} GB of rows {what} in {:.1} s",
                    t0.elapsed().as_secs_f64()
                );
            }
        };
        let how = match (how, &self.vectors) {
            (HostRows::Auto, Vectors::Mapped { range, .. }) => {
                match triton_rust_os::huge_copy_refused(range.len() as u64) {
                    None => HostRows::HugePages,
                    Some(why) => {
                        log::info!("table '{name}': rows read from the file's mapping, not copied into 2 MiB pages: {why}");
                        HostRows::Mapped
                    }
                }
            }
            (how, _) => how,
        };
        match (how, self.vectors) {
            (HostRows::HugePages, Vectors::Mapped { file, range }) => {
                match HugeCopy::new(&file.bytes()[range.clone()], threads) {
                    Ok(copy) => {
                        if !copy.huge() {
                            log::warn!("table '{name}': the kernel refused huge pages for the copy of its rows (transparent huge pages off?)");
                        }
                        slow("copied into huge pages");
                        TableFiles { vectors: Vectors::Copied(copy), ..self }
                    }
                    Err(e) => {
                        log::warn!("table '{name}': rows not copied into huge pages ({e}); read from the file's mapping");
                        TableFiles { vectors: Vectors::Mapped { file, range }, ..self }
                    }
                }
            }
            (_, Vectors::Mapped { file, range }) => {
                match file.populate(threads) {
                    Ok(()) => slow("mapped"),
                    Err(e) => log::warn!("table '{name}': rows not mapped ahead ({e}); their first reads fault them in"),
                }
                TableFiles { vectors: Vectors::Mapped { file, range }, ..self }
            }
            (_, copied) => TableFiles { vectors: copied, ..self },
        }
    }

    /// Whether the rows were copied at load (`HostRows::HugePages`, or `Auto` choosing it)
    /// rather than read from the file's mapping.
    pub fn copied(&self) -> bool {
        matches!(self.vectors, Vectors::Copied(_))
    }

    /// The raw bytes of row `i` (dim elements of `vector_type`).
    pub fn row_bytes(&self, i: usize) -> &[u8] {
        let w = self.dim * self.vector_type.size();
        &self.vector_bytes()[i * w..(i + 1) * w]
    }

    /// Row `i` as f32 into `out` (converting from fp16 when stored so).
    pub fn read_row(&self, i: usize, out: &mut [f32]) {
        decode_row(self.vector_type, self.row_bytes(i), out);
    }

    /// Whether the rows read are still the file's as loaded: rows copied at load always are;
    /// rows read from the file's mapping are not once the file was cut or rewritten (the
    /// error names the file and what happened). Asked after a read, it covers that read.
    pub fn check_rows(&self) -> std::result::Result<(), String> {
        match &self.vectors {
            Vectors::Mapped { file, .. } => {
                file.intact().map_err(|why| format!("its file '{}' {why}", file.path().display()))
            }
            Vectors::Copied(_) => Ok(()),
        }
    }

    pub fn vector_bytes(&self) -> &[u8] {
        match &self.vectors {
            Vectors::Mapped { file, range } => &file.bytes()[range.clone()],
            Vectors::Copied(copy) => copy.bytes(),
        }
    }
}

pub fn decode_row(t: VectorType, bytes: &[u8], out: &mut [f32]) {
    match t {
        VectorType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        VectorType::F16 => match bytemuck::try_cast_slice::<u8, half::f16>(bytes) {
            // whole rows at once (F16C/NEON where the CPU has them) when aligned on a LE host
            Ok(h) if cfg!(target_endian = "little") && h.len() == out.len() => {
                use half::slice::HalfFloatSliceExt;
                h.convert_to_f32_slice(out);
            }
            _ => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
    }
}

/// Converts a HugeCTR/HPS sparse model folder into our format in `dst`.
pub fn import_hugectr(src: &Path, dim: usize, dst: &Path) -> Result<usize> {
    let t = TableFiles::open_hugectr(src, dim)?;
    std::fs::create_dir_all(dst)
        .map_err(|e| Error::internal(format!("cannot create '{}': {e}", dst.display())))?;
    write_npy(&dst.join("keys.npy"), "<i8", &[t.rows], bytemuck::cast_slice(t.keys()))?;
    write_npy(
        &dst.join("vectors.npy"),
        VectorType::F32.npy_descr(),
        &[t.rows, dim],
        t.vector_bytes(),
    )?;
    Ok(t.rows)
}

/// Writes a table in our format (used by the generator and tests).
pub fn write_table(
    dir: &Path,
    keys: &[i64],
    vectors: &[u8],
    dim: usize,
    t: VectorType,
) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::internal(format!("cannot create '{}': {e}", dir.display())))?;
    write_npy(&dir.join("keys.npy"), "<i8", &[keys.len()], bytemuck::cast_slice(keys))?;
    write_npy(&dir.join("vectors.npy"), t.npy_descr(), &[keys.len(), dim], vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("trt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn npy_header_round_trip() {
        let d = tmp("npy");
        write_npy(&d.join("a.npy"), "<f4", &[3, 2], &[0u8; 24]).unwrap();
        let bytes = std::fs::read(d.join("a.npy")).unwrap();
        let h = parse_npy_header(&bytes).unwrap();
        assert_eq!((h.descr.as_str(), h.shape.as_slice()), ("<f4", &[3usize, 2][..]));
        assert_eq!(h.data_offset % 64, 0);
        assert_eq!(bytes.len(), h.data_offset + 24);
        // numpy's own spelling of a header
        let mut np = b"\x93NUMPY\x01\x00".to_vec();
        let dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }          \n";
        np.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        np.extend_from_slice(dict.as_bytes());
        assert_eq!(parse_npy_header(&np).unwrap().shape, vec![5]);
        assert!(parse_npy_header(b"garbage!!!!!").is_err());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn hugectr_import_round_trips() {
        let d = tmp("hugectr");
        let src = d.join("table0_sparse_0.model");
        std::fs::create_dir_all(&src).unwrap();
        let keys: Vec<i64> = vec![7, -3, 1 << 40, 0, 12];
        let dim = 3;
        let vecs: Vec<f32> = (0..keys.len() * dim).map(|i| i as f32 * 0.5 - 1.0).collect();
        std::fs::write(src.join("key"), bytemuck::cast_slice::<i64, u8>(&keys)).unwrap();
        std::fs::write(src.join("emb_vector"), bytemuck::cast_slice::<f32, u8>(&vecs)).unwrap();
        let dst = d.join("ours");
        assert_eq!(import_hugectr(&src, dim, &dst).unwrap(), 5);
        let t = TableFiles::open_npy(&dst).unwrap();
        assert_eq!(t.keys(), &keys[..]);
        assert_eq!((t.rows, t.dim, t.vector_type), (5, 3, VectorType::F32));
        let mut row = vec![0f32; dim];
        for i in 0..keys.len() {
            t.read_row(i, &mut row);
            assert_eq!(row, vecs[i * dim..(i + 1) * dim]);
        }
        // and back: our vectors are byte-identical to HugeCTR's emb_vector
        assert_eq!(t.vector_bytes(), std::fs::read(src.join("emb_vector")).unwrap());
        // a wrong dim is caught
        let e = TableFiles::open_hugectr(&src, 4).err().unwrap();
        assert!(e.message().contains("emb_vector"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn fp16_tables_decode() {
        let d = tmp("fp16");
        let vals = [half::f16::from_f32(1.5), half::f16::from_f32(-2.0)];
        write_table(&d, &[42], bytemuck::cast_slice(&vals), 2, VectorType::F16).unwrap();
        let t = TableFiles::open_npy(&d).unwrap();
        let mut row = [0f32; 2];
        t.read_row(0, &mut row);
        assert_eq!(row, [1.5, -2.0]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn rows_read_the_same_wherever_they_are_placed() {
        let d = tmp("place");
        let (rows, dim) = (3000usize, 8usize);
        let keys: Vec<i64> = (0..rows as i64).collect();
        let vals: Vec<half::f16> =
            (0..rows * dim).map(|i| half::f16::from_f32((i % 977) as f32 * 0.25)).collect();
        write_table(&d, &keys, bytemuck::cast_slice(&vals), dim, VectorType::F16).unwrap();
        let lazy = TableFiles::open_npy(&d).unwrap();
        let mapped = TableFiles::open_npy(&d).unwrap().place("t", HostRows::Mapped);
        let huge = TableFiles::open_npy(&d).unwrap().place("t", HostRows::HugePages);
        assert!(matches!(huge.vectors, Vectors::Copied(_)), "copied, huge pages or not");
        assert_eq!(huge.vector_bytes(), lazy.vector_bytes());
        assert_eq!(mapped.vector_bytes(), lazy.vector_bytes());
        let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
        for i in [0, 1, 1234, rows - 1] {
            lazy.read_row(i, &mut a);
            huge.read_row(i, &mut b);
            assert_eq!(a, b, "row {i}");
        }
        // auto: copied where the host offers huge pages and room, else mapped; the rows alike
        let auto = TableFiles::open_npy(&d).unwrap().place("t", HostRows::Auto);
        let offered = triton_rust_os::huge_copy_refused(auto.vector_bytes().len() as u64).is_none();
        assert_eq!(auto.copied(), offered, "auto copies exactly where the host offers huge pages");
        assert_eq!(auto.vector_bytes(), lazy.vector_bytes());
        assert!(!mapped.copied() && huge.copied());
        assert_eq!(HostRows::parse("").unwrap(), HostRows::Auto);
        assert_eq!(HostRows::parse("mapped").unwrap(), HostRows::Mapped);
        assert_eq!(HostRows::parse(" huge_pages ").unwrap(), HostRows::HugePages);
        let e = HostRows::parse("hugepages").unwrap_err();
        assert!(e.message().contains("host_memory") && e.message().contains("'hugepages'"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }
}
