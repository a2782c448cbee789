"""How long one thread takes to wake another on this host, without and with every CPU kept from
halting (host_qos.keep_cpus_polling): the cost each of a served request's hand-offs between
threads pays (client -> gRPC/HTTP thread -> scheduler -> instance thread and back). Two threads
pass a token back and forth through a pipe each way; the figure is half a round trip (median,
p90) over `--rounds`. Prints the CPU count and whether the host has a cpuidle driver first."""
import argparse
import os
import threading
import time

from host_qos import POLL_MODES, keep_cpus_polling


def hand_off_us(rounds):
    """(median, p90) microseconds of one wake-up, as half of a two-pipe round trip."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()

    def echo():
        for _ in range(rounds):
            os.read(r1, 1)
            os.write(w2, b"x")
    t = threading.Thread(target=echo)
    t.start()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        os.write(w1, b"x")
        os.read(r2, 1)
        ts.append((time.perf_counter() - t0) / 2 * 1e6)
        time.sleep(0.0005)  # let both sides go idle between rounds, as between requests
    t.join()
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    ts.sort()
    return ts[len(ts) // 2], ts[int(len(ts) * 0.9)]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=2000)
    a = p.parse_args()
    try:
        driver = open("/sys/devices/system/cpu/cpuidle/current_driver").read().strip()
    except OSError:
        driver = "none"
    print(f"{os.cpu_count()} CPUs, cpuidle driver: {driver}")
    m, p90 = hand_off_us(a.rounds)
    print(f"thread wake-up, CPUs halting:     median {m:6.1f} us  p90 {p90:6.1f} us")
    for mode in POLL_MODES:
        # each mode in a child, so that its spinners go with it
        pid = os.fork()
        if pid == 0:
            keep_cpus_polling(mode)
            time.sleep(0.3)
            m, p90 = hand_off_us(a.rounds)
            print(f"thread wake-up, CPUs kept polling ({mode}): median {m:6.1f} us  p90 {p90:6.1f} us", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
