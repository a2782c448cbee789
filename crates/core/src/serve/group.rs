//! One same-shape group run through the engine, and its outputs copied into each member's
//! response (host or GPU memory either side).

use super::*;

/// Runs one same-shape group (`members`: positions in `slots`) and writes each
/// member's outputs into its response. Returns the number of rows run. A member whose
/// own output fails gets its own error.
pub(super) fn run_group<T: Transport>(
    engine: &mut dyn Engine,
    device: Device,
    cfg: &ModelConfig,
    transport: &T,
    members: &[usize],
    slots: &mut [Slot<'_, T::Request, T::Response>],
    sink_ns: &mut u64,
) -> Result<usize> {
    // where a batch's time goes, measured only when it will be logged (`--log-verbose=1`)
    let timing = log::log_enabled!(log::Level::Debug);
    let clock = || if timing { transport.now_ns() } else { 0 };
    let t_start = clock();
    let sink_before = *sink_ns;
    // every output's copies are made and waited for inside the sink, while the engine's
    // buffer is lent; any left queued when this returns or unwinds (a sink that failed
    // between queueing and its wait) are dropped, never made from a buffer that is gone
    let _leftovers = DiscardQueued(transport.device_ops());
    // The batch borrows the requests' buffers, not the slots.
    let mut batch = {
        let group: Vec<&CheckedRequest<'_>> =
            members.iter().filter_map(|&i| slots[i].checked.as_ref()).collect();
        assemble(cfg, &group)?
    };
    let t_gather = clock();
    // GPU inputs: gathered into one buffer on the instance's GPU, where its engine reads
    // them, from wherever they lie (a client's CUDA shared memory may be on another GPU);
    // a KIND_CPU instance's on the GPU of their first part
    let home = match device {
        Device::Gpu(id) => Some(id),
        Device::Cpu => None,
    };
    for t in &mut batch.tensors {
        let moved = match &t.data {
            BatchData::DeviceParts(parts) => {
                let to = home.or(parts.first().map(|p| p.device())).unwrap_or(0);
                Some(transport.device_ops().gather(to, parts)?)
            }
            BatchData::Borrowed(Bytes::Device(v)) => match home {
                Some(to) if to != v.device() => {
                    Some(transport.device_ops().gather(to, std::slice::from_ref(v))?)
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(b) = moved {
            t.data = BatchData::Gathered(b);
        }
    }
    let mut names: Vec<String> = Vec::new();
    for &m in members {
        for w in &slots[m].wanted {
            if !names.contains(w) {
                names.push(w.clone());
            }
        }
    }
    // the model's state outputs are run whether or not a client asked for them
    let states = cfg.sequence.as_ref().map(|s| s.states.as_slice()).unwrap_or_default();
    for st in states {
        if !names.contains(&st.output) {
            names.push(st.output.clone());
        }
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let ops = transport.device_ops();
    let t_run = clock();
    // a GPU engine's outputs are offered to Triton as GPU memory wherever the engine put
    // them: the memory Triton gives back tells where the responses want them
    let prefer = device;
    let (mut to_host, mut to_device) = (false, false);
    // the outputs' time: their buffers and copies queued, then the wait for the copies
    let (mut queued_ns, mut waited_ns) = (0u64, 0u64);
    let ran = engine.run(&batch.tensors, &names, &mut |view| {
        let t0 = transport.now_ns();
        let parts = scatter_ranges(cfg, &batch, view.name, view.dtype, view.shape, view.data)?;
        let is_state = states.iter().any(|st| st.output == view.name);
        for (k, &m) in members.iter().enumerate() {
            let slot = &mut slots[m];
            if slot.outcome.is_err() {
                continue;
            }
            let (shape, range) = &parts[k];
            if is_state {
                // the sequence's next state, staged: committed by `execute` once every
                // output of this request was delivered
                let mut copy = |dst: BytesMut<'_>| copy_part(ops, &view, range.clone(), dst);
                if let Err(e) = slot.request.stage_state(
                    view.name,
                    view.dtype,
                    shape,
                    range.len(),
                    prefer,
                    &mut copy,
                ) {
                    slot.outcome = Err(e.context(format!("state '{}'", view.name)));
                    continue;
                }
            }
            if !slot.wanted.iter().any(|w| w == view.name) {
                continue;
            }
            if let Some(resp) = slot.response.as_mut() {
                match write_output(ops, resp, &view, shape, range.clone(), prefer) {
                    Ok(Device::Cpu) => to_host = true,
                    Ok(Device::Gpu(_)) => to_device = true,
                    Err(e) => slot.outcome = Err(e),
                }
            }
        }
        // every member's copy of this output queued: one wait for them all, while the
        // engine's buffer is still lent to us
        let t_queued = clock();
        let waited = ops.finish_copies();
        let t1 = transport.now_ns();
        if timing {
            queued_ns += t_queued.saturating_sub(t0);
            waited_ns += t1.saturating_sub(t_queued);
        }
        *sink_ns += t1.saturating_sub(t0);
        waited.map_err(|e| {
            Error::from(e).context(format!("output '{}' copied into the responses", view.name))
        })
    });
    ran?;
    if to_host || to_device {
        engine.outputs_landed(to_host && !to_device);
    }
    if timing {
        let (end, outputs) = (transport.now_ns(), *sink_ns - sink_before);
        log::debug!(
            "timing: requests {}, rows {}, assemble {} us, gather {} us, engine {} us, outputs into responses {} us, outputs queued {} us, outputs waited {} us",
            members.len(),
            batch.total_rows,
            t_run.saturating_sub(t_start) / 1000,
            t_run.saturating_sub(t_gather) / 1000,
            end.saturating_sub(t_run).saturating_sub(outputs) / 1000,
            outputs / 1000,
            queued_ns / 1000,
            waited_ns / 1000
        );
    }
    Ok(batch.total_rows)
}

/// Copies one request's part of an output into its response, from host or GPU memory,
/// into the memory the server offers for `prefer` (a GPU engine's: ensembles keep tensors
/// on the GPU between steps). Returns where the response's buffer is.
fn write_output<R: InferResponse>(
    ops: &dyn DeviceOps,
    resp: &mut R,
    out: &OutputView<'_>,
    shape: &[i64],
    range: std::ops::Range<usize>,
    prefer: Device,
) -> Result<Device> {
    let dst = resp.output_buffer(out.name, out.dtype, shape, range.len(), prefer)?;
    let landed = dst.device();
    let src = part_of(out, range)?;
    // queued where it can be: `run_group` waits for them all once the engine is done
    ops.copy_queued(src, dst)
        .map_err(|e| Error::from(e).context(format!("output '{}'", out.name)))?;
    Ok(landed)
}

/// Bytes `range` of an engine's output.
fn part_of<'a>(out: &OutputView<'a>, range: std::ops::Range<usize>) -> Result<Bytes<'a>> {
    out.data.slice(range.clone()).ok_or_else(|| {
        Error::internal(format!(
            "output '{}': rows {range:?} are outside the engine's {} bytes",
            out.name,
            out.data.len()
        ))
    })
}

/// Copies bytes `range` of an engine's output into `dst`, host or GPU either side.
fn copy_part(
    ops: &dyn DeviceOps,
    out: &OutputView<'_>,
    range: std::ops::Range<usize>,
    dst: BytesMut<'_>,
) -> Result<()> {
    let src = part_of(out, range)?;
    ops.copy(src, dst).map_err(|e| Error::from(e).context(format!("output '{}'", out.name)))
}

/// Drops the copies left queued on this thread when it goes (see `run_group`).
struct DiscardQueued<'a>(&'a dyn DeviceOps);

impl Drop for DiscardQueued<'_> {
    fn drop(&mut self) {
        self.0.discard_queued();
    }
}
