"""What a run cost the host, and what the server logged over it: the host's busy share, the cores
tritonserver and the client (the benchmark's children) used, the server's busiest threads; the
backend's `timing:` lines since a point of the server's log (bench/gpu/dlrm_v2_perf.py's runs)."""
import os
import subprocess


def cpu_sample(a):
    """(host jiffies busy, host jiffies in all, the server's jiffies, children's CPU seconds so far,
    the server's threads, host jiffies in the kernel, host jiffies stolen by the hypervisor)."""
    import resource
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    threads = server_threads(a)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    kernel = v[2] + sum(v[5:7])  # system, irq, softirq
    steal = v[7] if len(v) > 7 else 0  # a virtual CPU ready but its host running something else
    return (sum(v) - idle, sum(v), sum(t[1] for t in threads.values()), ch.ru_utime + ch.ru_stime, threads, kernel,
            steal)


def server_threads(a):
    """{thread id: (name, jiffies of user and system time, jiffies of system time, nanoseconds
    runnable but waiting for a core)} of the server's threads (the wait from schedstat: 0 where the
    kernel keeps none); {} where there is no server. The server's time is taken as their sum: a
    thread that ends between two samples is not counted."""
    out = {}
    try:
        from tritonserver_process import server_pid
        base = f"/proc/{server_pid(a.port)}/task"
        for tid in os.listdir(base):
            try:
                with open(f"{base}/{tid}/stat") as f:
                    head, rest = f.read().rsplit(")", 1)
                fields = rest.split()
                out[tid] = (head.split("(", 1)[1], int(fields[11]) + int(fields[12]), int(fields[12]),
                            _run_queue_ns(f"{base}/{tid}/schedstat"))
            except (OSError, ValueError, IndexError):
                continue
    except (OSError, SystemExit):
        pass
    return out


def _run_queue_ns(path):
    """The nanoseconds a thread has waited runnable for a core (schedstat's second field); 0
    where the kernel keeps no schedstat."""
    try:
        with open(path) as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _wait_ns(thread):
    """A thread's run-queue nanoseconds from server_threads(); 0 for a sample without them."""
    return thread[3] if len(thread) > 3 else 0


def _kernel_jiffies(thread):
    """A thread's system-time jiffies from server_threads(); 0 for a sample without them."""
    return thread[2] if len(thread) > 2 else 0


def _host_kernel(s0, s1):
    """The host's jiffies in the kernel between two cpu_sample()s; None where they lack them."""
    return s1[5] - s0[5] if len(s0) > 5 and len(s1) > 5 else None


def _host_steal(s0, s1):
    """The host's jiffies stolen by the hypervisor between two cpu_sample()s; None where they lack
    them."""
    return s1[6] - s0[6] if len(s0) > 6 and len(s1) > 6 else None


def cpu_use(s0, s1, seconds):
    """The host's CPU over a run, from two cpu_sample()s: busy %, cores used by the server and by
    the client (the benchmark's children: perf_analyzer or stream_client, counted once they exit);
    how much of it was in the kernel (the host's share of its time, the server's cores, and each kind
    of thread's: page faults, futex waits and wake-ups, yields are counted there); how long each kind
    waited runnable for a core (in cores: more threads runnable than cores, or the hypervisor's
    steal), and the host's steal share."""
    hz = os.sysconf("SC_CLK_TCK")
    total = max(1, s1[1] - s0[1])
    per = lambda j: j / hz / max(seconds, 1e-9)  # noqa: E731  jiffies to cores
    used = [(t[1] - s0[4].get(tid, (t[0], 0))[1], t[0], _kernel_jiffies(t) - _kernel_jiffies(s0[4].get(tid, ())),
             _wait_ns(t) - _wait_ns(s0[4].get(tid, ()))) for tid, t in s1[4].items()]
    busiest = sorted(((j, n) for j, n, _, _ in used), reverse=True)[:6]
    # threads of one kind together (reader-3, torch-gpu-5: their name less the number)
    kinds, kinds_sys, kinds_wait = {}, {}, {}
    for j, n, k, w in used:
        kind = n.rstrip("0123456789").rstrip("-_") or n
        kinds[kind] = kinds.get(kind, 0) + j
        kinds_sys[kind] = kinds_sys.get(kind, 0) + k
        kinds_wait[kind] = kinds_wait.get(kind, 0) + w
    by_kind = sorted(((j, k) for k, j in kinds.items()), reverse=True)[:6]
    out = {"threads_by_kind": [[k, per(j)] for j, k in by_kind], "host_busy_pct": 100.0 * (s1[0] - s0[0]) / total,
           "cpus": os.cpu_count(), "server_cores": per(s1[2] - s0[2]),
           "client_cores": (s1[3] - s0[3]) / max(seconds, 1e-9),
           "busiest_server_threads": [[n, per(j)] for j, n in busiest],
           "server_kernel_cores": per(sum(k for _, _, k, _ in used)),
           "kernel_by_kind": [[k, per(kinds_sys[k])] for _, k in by_kind]}
    waited = sum(w for *_, w in used)
    if waited:
        out["server_waiting_cores"] = waited / 1e9 / max(seconds, 1e-9)
        out["waiting_by_kind"] = [[k, kinds_wait[k] / 1e9 / max(seconds, 1e-9)] for _, k in by_kind]
    if _host_kernel(s0, s1) is not None:
        out["host_kernel_pct"] = 100.0 * _host_kernel(s0, s1) / total
    if _host_steal(s0, s1) is not None:
        out["host_steal_pct"] = 100.0 * _host_steal(s0, s1) / total
    return out


def cpu_use_spans(spans, seconds):
    """cpu_use over several timed spans (each a pair of cpu_sample()s), the gaps between them (an
    endless stream's key draws) left out; `seconds` the spans' time together."""
    busy = total = server = children = kernel = steal = 0
    threads = {}
    for s0, s1 in spans:
        busy, total = busy + s1[0] - s0[0], total + s1[1] - s0[1]
        server, children = server + s1[2] - s0[2], children + s1[3] - s0[3]
        kernel += _host_kernel(s0, s1) or 0
        steal += _host_steal(s0, s1) or 0
        for tid, t in s1[4].items():
            was, had = s0[4].get(tid, (t[0], 0)), threads.get(tid, (t[0], 0, 0, 0))
            threads[tid] = (t[0], had[1] + t[1] - was[1], had[2] + _kernel_jiffies(t) - _kernel_jiffies(was),
                            had[3] + _wait_ns(t) - _wait_ns(was))
    return cpu_use((0, 0, 0, 0, {}, 0, 0), (busy, total, server, children, threads, kernel, steal), seconds)


def cpu_text(c):
    threads = ", ".join(f"{n} {cores:.2f}" for n, cores in c.get("busiest_server_threads", []))
    kinds = ", ".join(f"{n} {cores:.1f}" for n, cores in c.get("threads_by_kind", []))
    kernel = ""
    if "server_kernel_cores" in c:
        by = ", ".join(f"{n} {cores:.1f}" for n, cores in c.get("kernel_by_kind", []))
        host = f"host {c['host_kernel_pct']:.0f}%, " if "host_kernel_pct" in c else ""
        kernel = f"; in the kernel: {host}tritonserver {c['server_kernel_cores']:.1f} cores ({by})"
    if "server_waiting_cores" in c:
        by = ", ".join(f"{n} {cores:.1f}" for n, cores in c.get("waiting_by_kind", []))
        kernel += f"; waiting runnable for a core: tritonserver {c['server_waiting_cores']:.1f} cores ({by})"
    if "host_steal_pct" in c:
        kernel += f"; stolen by the hypervisor: {c['host_steal_pct']:.1f}% of the host"
    return (f"CPU: host {c['host_busy_pct']:.0f}% busy of {c['cpus']}, tritonserver {c['server_cores']:.1f} cores, "
            f"client {c['client_cores']:.1f} cores; the server's busiest threads (cores): {threads}; "
            f"by kind (cores): {kinds}{kernel}")


def log_size(a):
    path = os.path.join(a.work, "server.log")
    return os.path.getsize(path) if os.path.exists(path) else 0


def timing_of_run(a, start):
    """With --verbose: the medians and 99th percentiles of the backend's `timing:` lines the server
    logged since byte `start` of its log (bench/gpu/timing_summary.py), printed; {kind: {step: [median, p99, n]}}."""
    import timing_summary
    with open(os.path.join(a.work, "server.log"), "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    found = timing_summary.figures(lines)
    out = {}
    for (kind, label), v in found.items():
        med, p99 = timing_summary.rank(v, 0.5), timing_summary.rank(v, 0.99)
        out.setdefault(kind, {})[label] = [med, p99, len(v)]
        print(f"    timing {kind}: {label} median {med} p99 {p99} (n={len(v)})", flush=True)
    return out


def gpu_fields(fallback):
    """The first GPU's name, driver and memory from nvidia-smi, as three stripped texts;
    `fallback` ("name,driver,memory") where nvidia-smi is missing or says nothing."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True)
        line = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""
    except OSError:
        line = ""
    return [x.strip() for x in ((line or fallback).split(",") + ["-", "-"])[:3]]

