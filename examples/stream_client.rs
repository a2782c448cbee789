//! An endless-stream load client for Triton's HTTP endpoint, for `bench/gpu/stream_load.py`:
//! requests whose tensors already lie in registered shared-memory regions (system or CUDA),
//! named by offset, sent by `--concurrency` threads each on one keep-alive connection, as
//! fast as answers come back. Python draws the key pool and registers the regions; this
//! client only sends, so that a pool too large for perf_analyzer's JSON (tens of GB of keys)
//! is served at the rate of a compiled client rather than of Python threads.
//!
//! Request `i` (for `i` in `start..start + count`) reads input `name` at offset
//! `(i mod pool) * bytes` of its region; each thread writes its outputs to its own region
//! (`<prefix><thread>`). Prints one JSON line: `{"seconds": .., "latencies_ms": [..]}`;
//! exits 1 with the server's answer at the first request that fails.
//!
//!   stream_client --url localhost:8000 --model dlrm_one --start 0 --count 1882 --concurrency 4 \
//!       --input sparse,INT64,65536x26,stream_keys,13631488,1882 \
//!       --input dense,FP32,65536x13,stream_dense,3407872,8 --output prediction,stream_out_,262144
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

struct Input {
    name: String,
    datatype: String,
    shape: Vec<u64>,
    region: String,
    bytes: u64,
    pool: u64,
}

struct Output {
    name: String,
    prefix: String,
    bytes: u64,
}

struct Args {
    url: String,
    model: String,
    start: u64,
    count: u64,
    concurrency: usize,
    inputs: Vec<Input>,
    outputs: Vec<Output>,
}

fn usage(why: &str) -> ! {
    eprintln!("stream_client: {why}");
    eprintln!(
        "usage: stream_client --url HOST:PORT --model M --start I --count N --concurrency K \
         --input NAME,DTYPE,DxD..,REGION,BYTES,POOL... --output NAME,REGION_PREFIX,BYTES..."
    );
    std::process::exit(2)
}

fn number(text: &str, what: &str) -> u64 {
    text.parse().unwrap_or_else(|_| usage(&format!("{what}: '{text}' is not a number")))
}

/// `value`'s comma-separated fields, as many as `form` names.
fn fields<'v>(value: &'v str, flag: &str, form: &str) -> Vec<&'v str> {
    let f: Vec<&str> = value.split(',').collect();
    if f.len() != form.split(',').count() {
        usage(&format!("{flag} '{value}': {form}"));
    }
    f
}

fn parse_args() -> Args {
    let mut a = Args {
        url: "localhost:8000".into(),
        model: String::new(),
        start: 0,
        count: 0,
        concurrency: 1,
        inputs: Vec::new(),
        outputs: Vec::new(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--url" => a.url = value.clone(),
            "--model" => a.model = value.clone(),
            "--start" => a.start = number(value, flag),
            "--count" => a.count = number(value, flag),
            "--concurrency" => a.concurrency = number(value, flag).max(1) as usize,
            "--input" => {
                let f = fields(value, "--input", "NAME,DTYPE,DxD..,REGION,BYTES,POOL");
                a.inputs.push(Input {
                    name: f[0].into(),
                    datatype: f[1].into(),
                    shape: f[2].split('x').map(|d| number(d, "--input shape")).collect(),
                    region: f[3].into(),
                    bytes: number(f[4], "--input bytes"),
                    pool: number(f[5], "--input pool").max(1),
                });
            }
            "--output" => {
                let f = fields(value, "--output", "NAME,REGION_PREFIX,BYTES");
                a.outputs.push(Output {
                    name: f[0].into(),
                    prefix: f[1].into(),
                    bytes: number(f[2], "--output bytes"),
                });
            }
            _ => usage(&format!("unknown argument {flag}")),
        }
    }
    if a.model.is_empty() || a.inputs.is_empty() {
        usage("--model and at least one --input are needed");
    }
    a
}

/// The body of request `i` from thread `slot`.
fn body(a: &Args, i: u64, slot: usize) -> String {
    let inputs: Vec<String> = a
        .inputs
        .iter()
        .map(|t| {
            let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
            format!(
                "{{\"name\":\"{}\",\"datatype\":\"{}\",\"shape\":[{}],\"parameters\":{{\"shared_memory_region\":\"{}\",\
                 \"shared_memory_offset\":{},\"shared_memory_byte_size\":{}}}}}",
                t.name,
                t.datatype,
                shape.join(","),
                t.region,
                (i % t.pool) * t.bytes,
                t.bytes
            )
        })
        .collect();
    let outputs: Vec<String> = a
        .outputs
        .iter()
        .map(|o| {
            format!(
                "{{\"name\":\"{}\",\"parameters\":{{\"shared_memory_region\":\"{}{}\",\"shared_memory_byte_size\":{}}}}}",
                o.name, o.prefix, slot, o.bytes
            )
        })
        .collect();
    format!("{{\"inputs\":[{}],\"outputs\":[{}]}}", inputs.join(","), outputs.join(","))
}

/// One request on a keep-alive connection: the status and the body of the answer.
fn exchange(
    conn: &mut BufReader<TcpStream>,
    host: &str,
    model: &str,
    body: &str,
) -> std::io::Result<(u32, Vec<u8>)> {
    let head = format!(
        "POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let stream = conn.get_mut();
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut line = String::new();
    conn.read_line(&mut line)?;
    let status =
        line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| {
            std::io::Error::other(format!("not an HTTP answer: '{}'", line.trim()))
        })?;
    let mut length = None;
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("the server closed the connection"));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
        }
    }
    let length = length.ok_or_else(|| std::io::Error::other("an answer without Content-Length"))?;
    let mut answer = vec![0u8; length];
    conn.read_exact(&mut answer)?;
    Ok((status, answer))
}

fn main() {
    let a = Arc::new(parse_args());
    let next = Arc::new(AtomicU64::new(a.start));
    let end = a.start + a.count;
    let failed = Arc::new(AtomicBool::new(false));
    let error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    // every connection open before the clock starts
    let mut conns = Vec::new();
    for _ in 0..a.concurrency {
        let stream = TcpStream::connect(&a.url).unwrap_or_else(|e| {
            eprintln!("stream_client: cannot connect to {}: {e}", a.url);
            std::process::exit(1)
        });
        let _ = stream.set_nodelay(true);
        conns.push(BufReader::new(stream));
    }
    let started = Instant::now();
    let workers: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(slot, mut conn)| {
            let (a, next, failed, error) = (a.clone(), next.clone(), failed.clone(), error.clone());
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                while !failed.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    let text = body(&a, i, slot);
                    let t = Instant::now();
                    let why = match exchange(&mut conn, &a.url, &a.model, &text) {
                        Ok((200, _)) => None,
                        Ok((status, answer)) => Some(format!(
                            "request {i}: HTTP {status}: {}",
                            String::from_utf8_lossy(&answer)
                        )),
                        Err(e) => Some(format!("request {i}: {e}")),
                    };
                    if let Some(why) = why {
                        failed.store(true, Ordering::Relaxed);
                        error.lock().unwrap().get_or_insert(why);
                        break;
                    }
                    mine.push(t.elapsed().as_secs_f64() * 1e3);
                }
                mine
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.join().unwrap_or_default());
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(why) = error.lock().unwrap().take() {
        eprintln!("stream_client: {why}");
        std::process::exit(1);
    }
    let list: Vec<String> = latencies.iter().map(|l| format!("{l:.4}")).collect();
    println!("{{\"seconds\":{seconds:.6},\"latencies_ms\":[{}]}}", list.join(","));
}
