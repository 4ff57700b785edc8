//! The validator's ledger: the loss records the router accepted for the last few epochs,
//! each sample once, kept until the epoch is scored (pure).

use std::collections::{BTreeMap, HashSet};

use crate::wire::messages::LossRecord;

/// Epochs whose records are kept (the one scored next, the one running, one to spare).
const KEEP_EPOCHS: usize = 3;

/// Records kept per epoch: far above what any plan feeds (the router takes each drawn
/// sample once), a bound should that ever change.
const MAX_RECORDS: usize = 1 << 20;

/// The loss records of the last few epochs, in the order they were accepted.
/// The first record of each sample is kept; a later claim of the same sample is dropped.
#[derive(Default)]
pub(crate) struct Ledger {
    epochs: BTreeMap<u64, Vec<LossRecord>>,
    samples: BTreeMap<u64, HashSet<u64>>,
}

impl Ledger {
    /// Adds `epoch`'s accepted `records`, forgetting the oldest epochs beyond a few.
    pub(crate) fn add(&mut self, epoch: u64, records: Vec<LossRecord>) {
        let kept = self.epochs.entry(epoch).or_default();
        let seen = self.samples.entry(epoch).or_default();
        for record in records {
            if kept.len() >= MAX_RECORDS {
                break;
            }
            if seen.insert(record.sample) {
                kept.push(record);
            }
        }
        while self.epochs.len() > KEEP_EPOCHS {
            if let Some((old, _)) = self.epochs.pop_first() {
                self.samples.remove(&old);
            }
        }
    }

    /// The records of `epoch` so far (what spot checks pick from).
    pub(crate) fn epoch(&self, epoch: u64) -> Option<&[LossRecord]> {
        self.epochs.get(&epoch).map(Vec::as_slice)
    }

    /// Takes `epoch`'s records to score them: an epoch is given once.
    pub(crate) fn take(&mut self, epoch: u64) -> Vec<LossRecord> {
        self.samples.remove(&epoch);
        self.epochs.remove(&epoch).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: u64) -> Vec<LossRecord> {
        (0..n)
            .map(|i| LossRecord {
                sample: i,
                pathway: vec!["a".into(), "b".into()],
                loss: 3.0,
                receipts: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn the_ledger_keeps_a_few_epochs_and_gives_each_once() {
        let mut ledger = Ledger::default();
        for epoch in 0..5 {
            ledger.add(epoch, records(3));
        }
        assert!(ledger.take(0).is_empty(), "the oldest epochs are forgotten");
        // A sample claimed again (by another tail) is not counted twice.
        ledger.add(4, records(3));
        assert_eq!(ledger.epochs[&4].len(), 3);
        assert_eq!(ledger.take(4).len(), 3);
        assert!(ledger.take(4).is_empty(), "an epoch is scored once");
    }
}
