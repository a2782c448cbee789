//! Converts a HugeCTR/HPS sparse model folder (`key`, `emb_vector`) into the store's
//! table format (`keys.npy`, `vectors.npy`). The backend also reads HugeCTR folders as
//! they are; converting gives numpy-readable files.
//!
//!   cargo run --release -p triton_rust_embedding --example import_hugectr -- <hugectr folder> <dim> <output dir>
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: {} <hugectr sparse folder> <embedding dim> <output table dir>", args[0]);
        std::process::exit(2);
    }
    let dim: usize = match args[2].parse() {
        Ok(d) => d,
        Err(_) => {
            eprintln!("embedding dim must be a positive integer, got '{}'", args[2]);
            std::process::exit(2);
        }
    };
    match triton_rust_embedding::table::import_hugectr(
        Path::new(&args[1]),
        dim,
        Path::new(&args[3]),
    ) {
        Ok(rows) => println!("{rows} rows of dim {dim} written to {}", args[3]),
        Err(e) => {
            eprintln!("import failed: {e}");
            std::process::exit(1);
        }
    }
}
