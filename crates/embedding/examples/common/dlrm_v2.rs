//! MLPerf DLRM-v2's tables, for the example programs that take its shape: each table's rows and
//! keys a bag (214 keys a sample), dim 128.

/// Rows per table.
pub const ROWS: [usize; 26] = [
    40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282,
    10, 2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108,
    36,
];
/// Keys a bag, per table.
pub const HOTNESS: [usize; 26] =
    [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1];
pub const DIM: usize = 128;
