"""Merge durations from the miners' logs of a swarm run.

A miner logs its epoch phases at debug level (RUST_LOG=…,iota_p2p::services::miner::task=debug);
a merge lasts from `Planned { epoch: e }` (the plan accepted) to `Training { epoch: e }` (the
merged stage in place, its checkpoint written), for every e >= 1. Prints, per run directory,
the median over all merges and the mean over epochs of each epoch's longest merge (what
`iota-p2p simulate` reports as `merge s`).

    python3 scripts/merge_times.py DIR [DIR ...]   # each DIR holds miner-*.log
"""
import collections
import datetime
import glob
import re
import statistics
import sys

PHASE = re.compile(r"(\S+) DEBUG .*epoch phase phase=(\w+) \{ epoch: (\d+)")


def seconds(stamp):
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def merges(directory):
    per_epoch = collections.defaultdict(list)
    for path in sorted(glob.glob(f"{directory}/miner-*.log")):
        planned = {}
        with open(path, errors="replace") as log:
            for line in log:
                m = PHASE.match(line)
                if not m:
                    continue
                at, phase, epoch = seconds(m.group(1)), m.group(2), int(m.group(3))
                if phase == "Planned":
                    planned[epoch] = at
                elif phase == "Training" and epoch >= 1 and epoch in planned:
                    per_epoch[epoch].append(at - planned[epoch])
    return per_epoch


def longest_mean(per_epoch):
    """The longest merge of each epoch, averaged over the epochs (None without merges)."""
    return statistics.mean(max(v) for v in per_epoch.values()) if per_epoch else None


def main(directories):
    for directory in directories:
        per_epoch = merges(directory)
        every = [s for v in per_epoch.values() for s in v]
        if not every:
            print(f"{directory}: no merges logged (was the miner task's debug log on?)")
            continue
        longest = longest_mean(per_epoch)
        print(
            f"{directory}: {len(every)} merges, median {statistics.median(every):.3f} s, "
            f"longest of an epoch {longest:.3f} s (mean over {len(per_epoch)} epochs)"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
