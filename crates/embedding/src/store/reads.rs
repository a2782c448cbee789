//! What the miss path's two ways of sharing a call's reads among the reader crew share
//! (`gather.rs`: fixed shares, each read whole; `steal.rs`: shares whose unread ends others take).

/// Keys a reader prefetches ahead of the one it copies.
pub(super) const AHEAD: usize = 16;

/// A dense, untouched table as the readers see it: its rows' bytes, how many rows, and its
/// default value's bytes (one element) for a key past them.
pub(super) type DenseTable<'a> = (&'a [u8], usize, Vec<u8>);

/// How a `gather_dense` call's readers spent its time, added over calls: the wall time, the
/// latest a share started after the call began (a share waits for a free reader), the longest
/// share's own time and every share's time summed (busy / wall: readers at work at once). With
/// the ends taken by others (`steal.rs`) a share's time is its reader's whole time in the call,
/// the blocks it took from others' shares included.
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherTimes {
    pub calls: u64,
    pub wall_ns: u64,
    pub last_start_ns: u64,
    pub longest_ns: u64,
    pub busy_ns: u64,
    pub shares: u64,
}

impl GatherTimes {
    pub(super) fn add(&mut self, o: &GatherTimes) {
        self.calls += o.calls;
        self.wall_ns += o.wall_ns;
        self.last_start_ns += o.last_start_ns;
        self.longest_ns += o.longest_ns;
        self.busy_ns += o.busy_ns;
        self.shares += o.shares;
    }
    /// Adds `o`'s times to these.
    pub fn absorb(&mut self, o: Option<GatherTimes>) {
        if let Some(o) = o {
            self.add(&o);
        }
    }
}
