//! Keys: the hash every tier (and the GPU kernel) places them by, and the Zipf skew of
//! recommender traffic that tests and benchmarks draw them from.

/// murmur3's 64-bit finalizer: the key hash used by every tier (and the GPU kernel).
pub fn mix64(key: i64) -> u64 {
    let mut k = key as u64;
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51afd7ed558ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ceb9fe1a85ec53);
    k ^= k >> 33;
    k
}

/// Draws keys from a Zipf distribution over `0..n` (rank 0 most frequent): the skew of
/// real recommender traffic, for tests and benchmarks.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, exponent: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|r| {
                acc += 1.0 / (r as f64).powf(exponent);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }
    /// Maps a uniform sample in [0, 1) to a rank.
    pub fn rank(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}
