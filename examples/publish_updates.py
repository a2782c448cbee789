"""Publishes embedding updates to a Redis Stream that libtriton_rust stores follow
(`parameters { key: "update_stream" value { string_value: "redis:<host:port>/<stream>" } }`).

Each entry is one update of one table: fields `table` (its name), `keys` (int64,
little-endian) and `vectors` (float32, little-endian, dim per key). Every serving node
reads the whole stream through its own consumer group and acknowledges an entry only
after it is durable in its update log.

    python examples/publish_updates.py --redis 127.0.0.1:6379 --stream updates \\
        --table u --dim 8 --keys 1,2,3 --value 0.5
"""
import argparse

import numpy as np


def publish(client, stream: str, table: str, keys, vectors) -> bytes:
    """Appends one update; returns the entry's id."""
    keys = np.ascontiguousarray(keys, dtype="<i8")
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    assert vectors.size % max(len(keys), 1) == 0, "vectors must hold dim values per key"
    return client.xadd(stream, {"table": table, "keys": keys.tobytes(), "vectors": vectors.tobytes()})


def main():
    import redis

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis", default="127.0.0.1:6379", help="host:port")
    p.add_argument("--stream", default="updates")
    p.add_argument("--table", required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--keys", required=True, help="comma-separated keys")
    p.add_argument("--value", type=float, default=0.0, help="every value of every row")
    a = p.parse_args()
    host, port = a.redis.rsplit(":", 1)
    keys = [int(k) for k in a.keys.split(",")]
    client = redis.Redis(host=host, port=int(port))
    entry = publish(client, a.stream, a.table, keys, np.full((len(keys), a.dim), a.value, np.float32))
    print(f"appended {entry.decode()}: {len(keys)} rows of table '{a.table}' to stream '{a.stream}'")


if __name__ == "__main__":
    main()
