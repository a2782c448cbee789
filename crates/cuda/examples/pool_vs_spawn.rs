//! What handing a batch's work to several threads costs by itself: scoped threads started
//! for each call (as the store's miss reads and the key uploads did) against tasks handed
//! to rayon's parked workers (as they do now). The tasks do nothing, so the figures are
//! the overhead alone, per call.
//!
//!   cargo run --release -p triton_rust_cuda --example pool_vs_spawn
fn main() {
    let mut v = vec![0u64; 16 * 1024];
    let iters = 200;
    println!(
        "{} CPUs, rayon pool of {} threads",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        rayon::current_num_threads()
    );
    for tasks in [2usize, 4, 8, 16] {
        let t = std::time::Instant::now();
        for _ in 0..iters {
            std::thread::scope(|s| {
                for c in v.chunks_mut(1024).take(tasks) {
                    s.spawn(move || c[0] += 1);
                }
            });
        }
        let spawned = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let t = std::time::Instant::now();
        for _ in 0..iters {
            rayon::scope(|s| {
                for c in v.chunks_mut(1024).take(tasks) {
                    s.spawn(move |_| c[0] += 1);
                }
            });
        }
        let pooled = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        println!("{tasks:2} tasks: threads started per call {spawned:7.1} us, rayon pool {pooled:6.1} us ({:.0}x)", spawned / pooled);
    }
    assert!(v.iter().step_by(1024).all(|&x| x > 0));
}
