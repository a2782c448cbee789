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

#[cfg(test)]
mod tests {
    use crate::cache::CacheGeometry;

    /// The multiply that maps a key's hash onto the sets stays below `sets` for any hash (a
    /// count past 2^32 too) and spreads keys as evenly as chance would: 64 Ki keys over 3 and
    /// over 64 sets, their chi-square under twice its degrees of freedom plus 20 (uniform
    /// counts give about the degrees of freedom; a skewed map gives thousands).
    #[test]
    fn set_of_spreads_keys_evenly_below_sets() {
        for sets in [1usize, 3, 64, (1 << 33) + 7] {
            let geo = CacheGeometry { sets, ..CacheGeometry::for_rows(1, 1) };
            for k in [0i64, 1, -1, i64::MIN, i64::MAX] {
                assert!(geo.set_of(k) < sets, "key {k} over {sets} sets");
            }
            if sets > 64 {
                continue;
            }
            let mut per = vec![0usize; sets];
            (0..65_536i64).for_each(|k| per[geo.set_of(k * 31 + 5)] += 1);
            let mean = 65_536.0 / sets as f64;
            let chi2: f64 = per.iter().map(|&c| (c as f64 - mean).powi(2) / mean).sum();
            assert!(
                chi2 < 2.0 * (sets - 1) as f64 + 20.0,
                "{sets} sets: chi-square {chi2}, {per:?}"
            );
        }
    }
}
