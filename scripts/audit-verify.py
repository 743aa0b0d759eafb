#!/usr/bin/env python3
"""Checks an export of moatd's audit log without moatd (standard library only).

    moat audit export --format jsonl > audit.jsonl
    scripts/audit-verify.py audit.jsonl [--anchor ID:HASH]

Each line is one event: {"id", "time_ms", "type", "environment", "actor",
"data", "prev_hash", "hash", ...}. An event's hash is the lowercase hex
SHA-256 of the UTF-8 bytes of the JSON array

    [id, time_ms, type, environment, actor, data, prev_hash]

written without whitespace, object keys sorted, non-ASCII characters as
themselves (docs/API.md, "Audit"): exactly json.dumps(..., sort_keys=True,
separators=(",", ":"), ensure_ascii=False). Event 1 links to 64 zeros; each
later event to the hash of the one before, and ids are consecutive.

An export that starts after event 1 (`--since`, or a pruned log) is checked
from its first event on; that event's own link cannot be checked without
what came before. --anchor ID:HASH (an id and hash kept elsewhere, e.g. from
an earlier `moat audit verify`) must be in the chain.

Prints "ok: ..." and exits 0, or "broken at event N: reason" and exits 1.
"""

import argparse
import hashlib
import json
import sys

GENESIS = "0" * 64


def chain_hash(e):
    canonical = json.dumps([e["id"], e["time_ms"], e["type"], e["environment"], e["actor"], e["data"],
                            e["prev_hash"]], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def verify(lines, anchor):
    expected_id = None
    expected_prev = None
    checked = 0
    last = None
    anchored = anchor is None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError as err:
            return False, f"line {number} is not JSON: {err}"
        if expected_id is None:
            expected_id = e["id"]
            expected_prev = GENESIS if e["id"] == 1 else e["prev_hash"]
        if e["id"] != expected_id:
            if e["id"] > expected_id:
                return False, f"broken at event {expected_id}: deleted (the next line is event {e['id']})"
            return False, f"broken at event {e['id']}: out of order (expected {expected_id})"
        if chain_hash(e) != e["hash"]:
            return False, f"broken at event {e['id']}: edited (its hash does not match its contents)"
        if e["prev_hash"] != expected_prev:
            return False, f"broken at event {e['id']}: prev_hash does not match the hash before it"
        if anchor is not None and e["id"] == anchor[0]:
            if e["hash"] != anchor[1]:
                return False, f"broken at event {e['id']}: its hash is not the anchored one"
            anchored = True
        checked += 1
        last = e
        expected_id = e["id"] + 1
        expected_prev = e["hash"]
    if not anchored:
        return False, f"the anchored event {anchor[0]} is not in the export"
    if last is None:
        return True, "ok: no events"
    return True, f"ok: {checked} events checked, last event {last['id']} hash {last['hash']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", help="the export (default: stdin)")
    parser.add_argument("--anchor", help="ID:HASH of an event that must be in the chain")
    args = parser.parse_args()
    anchor = None
    if args.anchor:
        event_id, _, digest = args.anchor.partition(":")
        anchor = (int(event_id), digest)
    stream = open(args.file, encoding="utf-8") if args.file else sys.stdin
    with stream:
        ok, message = verify(stream, anchor)
    print(message)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
