//! The host functions of the bspweb ABI a guest imports: arguments, messages,
//! output, resources, abort; every pointer and length a guest passes is
//! checked against its memory.

use super::*;

pub(super) fn build_linker(engine: &Engine) -> wasmtime::Result<Linker<ProcState>> {
    let mut l = Linker::new(engine);
    let m = HOST_MODULE;
    l.func_wrap(m, "pid", |c: Caller<'_, ProcState>| {
        c.data().host.pid as i32
    })?;
    l.func_wrap(m, "nprocs", |c: Caller<'_, ProcState>| {
        c.data().job.nprocs as i32
    })?;
    l.func_wrap(m, "superstep", |c: Caller<'_, ProcState>| {
        c.data().host.superstep as i32
    })?;
    l.func_wrap(m, "seed", |c: Caller<'_, ProcState>| {
        c.data().job.seed as i64
    })?;
    l.func_wrap(m, "args_len", |c: Caller<'_, ProcState>| {
        c.data().job.args.len() as i32
    })?;
    l.func_wrap(m, "args_read", host_args_read)?;
    l.func_wrap(m, "send", host_send)?;
    l.func_wrap(m, "send_range", host_send_range)?;
    l.func_wrap(m, "send_list", host_send_list)?;
    l.func_wrap(m, "msg_count", |c: Caller<'_, ProcState>| {
        c.data().host.inbox.len() as i32
    })?;
    l.func_wrap(m, "msg_info", host_msg_info)?;
    l.func_wrap(m, "msg_read", host_msg_read)?;
    l.func_wrap(m, "set_tag", |mut c: Caller<'_, ProcState>, tag: i32| {
        c.data_mut().send_tag = tag as u32;
    })?;
    l.func_wrap(
        m,
        "msg_tag",
        |c: Caller<'_, ProcState>, index: i32| -> i64 {
            let inbox = &c.data().host.inbox;
            match usize::try_from(index).ok().and_then(|i| inbox.get(i)) {
                Some(m) => i64::from(m.tag),
                None => i64::from(ERR_NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(m, "print", host_print)?;
    l.func_wrap(m, "write_raw", host_write_raw)?;
    l.func_wrap(m, "flush", host_flush)?;
    l.func_wrap(m, "abort", host_abort)?;
    l.func_wrap(m, "resource_len", host_resource_len)?;
    l.func_wrap(m, "resource_read", host_resource_read)?;
    Ok(l)
}

pub(super) type HostResult<T> = wasmtime::Result<T>;

pub(super) fn bad_call(c: &mut Caller<'_, ProcState>, msg: String) -> wasmtime::Error {
    c.data_mut().stop_with(Stop::BadHostCall(msg))
}

pub(super) fn guest_memory(c: &mut Caller<'_, ProcState>, call: &str) -> HostResult<Memory> {
    match c.data().memory {
        Some(m) => Ok(m),
        None => Err(bad_call(
            c,
            format!("`{call}` was called before the module's memory was available"),
        )),
    }
}

/// The byte range `ptr..ptr+len` if it lies inside a memory of `mem_len` bytes.
pub(super) fn guest_range(mem_len: usize, ptr: i32, len: usize) -> Option<Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len)?;
    (end <= mem_len).then_some(start..end)
}

pub(super) fn out_of_bounds(
    call: &str,
    what: &str,
    ptr: i32,
    len: usize,
    mem_len: usize,
) -> String {
    format!(
        "`{call}` {what} {len} bytes at address {:#x}, outside the process's {mem_len}-byte memory",
        ptr as u32
    )
}

/// Reads of guest memory this long or longer are streamed.
const STREAM_FROM: usize = 64 << 10;

/// Copy `len` bytes out of guest memory, trapping on an out-of-range pointer.
pub(super) fn read_guest(
    c: &mut Caller<'_, ProcState>,
    call: &str,
    ptr: i32,
    len: usize,
) -> HostResult<Vec<u8>> {
    let mem = guest_memory(c, call)?;
    let data = mem.data(&*c);
    match guest_range(data.len(), ptr, len) {
        // A large message (a block of numbers, a page of rows) is read
        // next by the writer that sends it: streamed, it leaves the guest's
        // cache alone (`crate::stream`).
        Some(r) if r.len() >= STREAM_FROM => Ok(crate::stream::to_vec(&data[r])),
        Some(r) => Ok(data[r].to_vec()),
        None => {
            let msg = out_of_bounds(call, "read", ptr, len, data.len());
            Err(bad_call(c, msg))
        }
    }
}

/// Copy `bytes` into guest memory at `ptr`, trapping on an out-of-range pointer.
pub(super) fn write_guest(
    c: &mut Caller<'_, ProcState>,
    call: &str,
    ptr: i32,
    bytes: &[u8],
) -> HostResult<()> {
    let mem = guest_memory(c, call)?;
    let data = mem.data_mut(&mut *c);
    match guest_range(data.len(), ptr, bytes.len()) {
        Some(r) => {
            data[r].copy_from_slice(bytes);
            Ok(())
        }
        None => {
            let msg = out_of_bounds(call, "wrote", ptr, bytes.len(), data.len());
            Err(bad_call(c, msg))
        }
    }
}

pub(super) fn host_args_read(mut c: Caller<'_, ProcState>, dst: i32) -> HostResult<()> {
    let job = c.data().job.clone();
    write_guest(&mut c, "args_read", dst, &job.args)
}

/// Queue `payload` for every pid of `dsts` (already validated).
pub(super) fn queue_messages(
    c: &mut Caller<'_, ProcState>,
    dsts: impl ExactSizeIterator<Item = Pid>,
    payload: Bytes,
) -> HostResult<()> {
    let s = c.data_mut();
    // The destinations share one copy of the payload (here, on the wire and
    // in checkpoints), so it counts once.
    let cost = dsts
        .len()
        .saturating_mul(MESSAGE_OVERHEAD)
        .saturating_add(payload.len());
    if s.outbox_bytes.saturating_add(cost) > s.job.outbox_limit {
        let stop = Stop::OutboxLimit {
            superstep: s.host.superstep,
            limit_mib: s.job.outbox_limit as u64 / MIB,
        };
        return Err(s.stop_with(stop));
    }
    // The resident size is read every few ticks: count what this process
    // queued in this superstep on top of it.
    let queued = s.outbox_bytes.saturating_add(cost) as u64;
    if !s.budget.fits(queued) {
        let why = s
            .budget
            .refusal("this process's messages of this superstep take", queued);
        return Err(s.stop_with(Stop::PeerMemory(why)));
    }
    s.outbox_bytes += cost;
    for dst in dsts {
        let seq = s.send_seq;
        s.send_seq = s.send_seq.wrapping_add(1);
        s.outbox.push(Outgoing {
            dst,
            seq,
            tag: s.send_tag,
            payload: payload.clone(),
        });
    }
    Ok(())
}

pub(super) fn host_send(
    mut c: Caller<'_, ProcState>,
    pid: i32,
    ptr: i32,
    len: i32,
) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_MESSAGE_BYTES {
        return Ok(ERR_TOO_LARGE);
    }
    let payload = read_guest(&mut c, "send", ptr, len)?;
    if pid < 0 || pid as u32 >= c.data().job.nprocs {
        return Ok(ERR_BAD_PID);
    }
    queue_messages(&mut c, std::iter::once(pid as u32), Bytes::from(payload))?;
    Ok(0)
}

pub(super) fn host_send_range(
    mut c: Caller<'_, ProcState>,
    lo: i32,
    hi: i32,
    ptr: i32,
    len: i32,
) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_MESSAGE_BYTES {
        return Ok(ERR_TOO_LARGE);
    }
    let payload = read_guest(&mut c, "send_range", ptr, len)?;
    let nprocs = c.data().job.nprocs as i64;
    let (lo, hi) = (lo as i64, hi as i64);
    if lo < 0 || hi > nprocs || lo >= hi {
        return Ok(ERR_BAD_RANGE);
    }
    queue_messages(&mut c, (lo as u32)..(hi as u32), Bytes::from(payload))?;
    Ok(0)
}

pub(super) fn host_send_list(
    mut c: Caller<'_, ProcState>,
    pids_ptr: i32,
    npids: i32,
    ptr: i32,
    len: i32,
) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_MESSAGE_BYTES {
        return Ok(ERR_TOO_LARGE);
    }
    let npids = npids as u32 as usize;
    let list_bytes = match npids.checked_mul(4) {
        Some(n) => n,
        None => {
            let msg = format!("`send_list` got an impossible pid count {npids}");
            return Err(bad_call(&mut c, msg));
        }
    };
    let raw = read_guest(&mut c, "send_list", pids_ptr, list_bytes)?;
    let payload = read_guest(&mut c, "send_list", ptr, len)?;
    let nprocs = c.data().job.nprocs;
    let pids: Vec<Pid> = raw
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if pids.iter().any(|&p| p >= nprocs) {
        return Ok(ERR_BAD_PID);
    }
    queue_messages(&mut c, pids.into_iter(), Bytes::from(payload))?;
    Ok(0)
}

pub(super) fn host_msg_info(mut c: Caller<'_, ProcState>, index: i32, out: i32) -> HostResult<i32> {
    let info = {
        let inbox = &c.data().host.inbox;
        match usize::try_from(index).ok().and_then(|i| inbox.get(i)) {
            Some(m) => {
                let mut b = [0u8; 12];
                b[0..4].copy_from_slice(&m.src.to_le_bytes());
                b[4..8].copy_from_slice(&m.superstep.to_le_bytes());
                b[8..12].copy_from_slice(&(m.payload.len() as u32).to_le_bytes());
                b
            }
            None => return Ok(ERR_NOT_FOUND),
        }
    };
    write_guest(&mut c, "msg_info", out, &info)?;
    Ok(0)
}

pub(super) fn host_msg_read(mut c: Caller<'_, ProcState>, index: i32, dst: i32) -> HostResult<i32> {
    let payload = {
        let inbox = &c.data().host.inbox;
        match usize::try_from(index).ok().and_then(|i| inbox.get(i)) {
            Some(m) => m.payload.clone(),
            None => return Ok(ERR_NOT_FOUND),
        }
    };
    write_guest(&mut c, "msg_read", dst, &payload)?;
    Ok(0)
}

/// Count `len` output bytes against the cap and return the record's sequence number.
pub(super) fn account_output(c: &mut Caller<'_, ProcState>, len: usize) -> HostResult<u64> {
    let s = c.data_mut();
    let total = s.host.output_bytes.saturating_add(len as u64);
    if total > s.job.output_limit {
        let stop = Stop::OutputLimit {
            limit_mib: s.job.output_limit / MIB,
        };
        return Err(s.stop_with(stop));
    }
    s.host.output_bytes = total;
    let seq = s.host.output_seq;
    s.host.output_seq += 1;
    Ok(seq)
}

pub(super) fn emit_output(
    c: &mut Caller<'_, ProcState>,
    stream: Stream,
    data: String,
    len: usize,
) -> HostResult<()> {
    let seq = account_output(c, len)?;
    let s = c.data_mut();
    // Back-pressure: wait while the peer has too much undelivered output
    // (off the async runtime's threads: the upload runs there).
    let job = s.job.clone();
    let deadline = s.deadline;
    let room = job.reporter.wait_for_room(Instant::now(), &job.kill)
        || off_async_worker(&s.slot, || job.reporter.wait_for_room(deadline, &job.kill));
    if !room {
        let stop = if s.job.kill.load(Ordering::Relaxed) {
            Stop::Killed
        } else {
            Stop::TimeLimit {
                superstep: s.host.superstep,
                secs: s.job.superstep_budget.as_secs_f64(),
            }
        };
        return Err(s.stop_with(stop));
    }
    s.output_mark = s.job.reporter.emit_marked(PeerEvent::Output {
        job: s.job.job,
        pid: s.host.pid,
        seq,
        stream,
        data,
    });
    Ok(())
}

pub(super) fn host_print(
    mut c: Caller<'_, ProcState>,
    stream: i32,
    ptr: i32,
    len: i32,
) -> HostResult<i32> {
    let stream = match stream {
        STREAM_STDOUT => Stream::Stdout,
        STREAM_STDERR => Stream::Stderr,
        other => {
            let msg = format!(
                "`print` to stream {other}; use {STREAM_STDOUT} (stdout) or {STREAM_STDERR} (stderr)"
            );
            return Err(bad_call(&mut c, msg));
        }
    };
    let len = len as u32 as usize;
    if len > MAX_OUTPUT_RECORD {
        return Ok(ERR_TOO_LARGE);
    }
    let bytes = read_guest(&mut c, "print", ptr, len)?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    emit_output(&mut c, stream, text, len)?;
    Ok(0)
}

pub(super) fn host_write_raw(mut c: Caller<'_, ProcState>, ptr: i32, len: i32) -> HostResult<i32> {
    let len = len as u32 as usize;
    if len > MAX_OUTPUT_RECORD {
        return Ok(ERR_TOO_LARGE);
    }
    let bytes = read_guest(&mut c, "write_raw", ptr, len)?;
    let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
    emit_output(&mut c, Stream::Raw, data, len)?;
    Ok(0)
}

pub(super) fn host_flush(mut c: Caller<'_, ProcState>) -> HostResult<i32> {
    let job = c.data().job.clone();
    // Off the async runtime's threads: the upload it waits for runs there.
    if !job.reporter.flush_blocking(Duration::ZERO, &job.kill) {
        off_async_worker(&c.data().slot, || {
            job.reporter.flush_blocking(FLUSH_TIMEOUT, &job.kill)
        });
    }
    if job.kill.load(Ordering::Relaxed) {
        return Err(c.data_mut().stop_with(Stop::Killed));
    }
    Ok(0)
}

pub(super) fn host_abort(mut c: Caller<'_, ProcState>, ptr: i32, len: i32) -> HostResult<()> {
    let len = (len as u32 as usize).min(MAX_ABORT_REASON);
    let bytes = read_guest(&mut c, "abort", ptr, len)?;
    let reason = String::from_utf8_lossy(&bytes).into_owned();
    Err(c.data_mut().stop_with(Stop::Abort(reason)))
}

pub(super) fn resource_name(
    c: &mut Caller<'_, ProcState>,
    call: &str,
    ptr: i32,
    len: i32,
) -> HostResult<String> {
    let bytes = read_guest(c, call, ptr, len as u32 as usize)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

pub(super) fn host_resource_len(
    mut c: Caller<'_, ProcState>,
    name_ptr: i32,
    name_len: i32,
) -> HostResult<i64> {
    let name = resource_name(&mut c, "resource_len", name_ptr, name_len)?;
    Ok(match c.data().job.resources.get(&name) {
        Some(r) => r.len() as i64,
        None => -1,
    })
}

pub(super) fn host_resource_read(
    mut c: Caller<'_, ProcState>,
    name_ptr: i32,
    name_len: i32,
    dst: i32,
) -> HostResult<i32> {
    let name = resource_name(&mut c, "resource_read", name_ptr, name_len)?;
    let job = c.data().job.clone();
    match job.resources.get(&name) {
        Some(r) => {
            write_guest(&mut c, "resource_read", dst, r)?;
            Ok(0)
        }
        None => Ok(ERR_NOT_FOUND),
    }
}
