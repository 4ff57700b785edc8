//! What the validator heard of the merges that close each epoch (pure): the hashes each
//! stage's replicas gossiped and how its own audit of each merge ended. Spot checks use
//! the hashes (weights equal to a merge's did not step); joiners' confirmation requests
//! are answered from both ([`super::confirmation::answer`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::services::merge::api::AuditVerdict;
use crate::wire::messages::{ConfirmationReply, ConfirmationRequest};

/// Epochs of merge hashes kept (a spot check needs the epoch before its own).
const KEEP_MERGE_EPOCHS: usize = 4;

/// Merges kept of each kind: a few epochs of up to 16 stages.
const KEPT: usize = KEEP_MERGE_EPOCHS * 16;

/// The merge hashes and audit verdicts of recent epochs, per (epoch, stage).
#[derive(Default)]
pub(crate) struct MergeBook {
    /// Merge hashes gossiped per (epoch, stage).
    merged: BTreeMap<(u64, u32), BTreeSet<String>>,
    /// How the audit of each (epoch, stage) merge ended.
    audits: BTreeMap<(u64, u32), AuditVerdict>,
}

impl MergeBook {
    /// A stage's replicas gossiped `hash` as their merge closing `epoch`.
    pub(crate) fn merged(&mut self, epoch: u64, stage: u32, hash: String) {
        self.merged.entry((epoch, stage)).or_default().insert(hash);
        while self.merged.len() > KEPT {
            self.merged.pop_first();
        }
    }

    /// This validator's audit of the merge of `stage` closing `epoch` ended.
    pub(crate) fn audited(&mut self, epoch: u64, stage: u32, verdict: AuditVerdict) {
        self.audits.insert((epoch, stage), verdict);
        while self.audits.len() > KEPT {
            self.audits.pop_first();
        }
    }

    /// The hashes of the weights `stage` may start `epoch` from: the merges gossiped for
    /// the epoch before.
    pub(crate) fn starts(&self, epoch: u64, stage: u32) -> BTreeSet<String> {
        epoch
            .checked_sub(1)
            .and_then(|before| self.merged.get(&(before, stage)))
            .cloned()
            .unwrap_or_default()
    }

    /// The hashes `stage`'s replicas gossiped for the merge closing `epoch` (what a
    /// `Superseded` spot-check answer is checked against).
    pub(crate) fn heard(&self, epoch: u64, stage: u32) -> Option<&BTreeSet<String>> {
        self.merged.get(&(epoch, stage))
    }

    /// This validator's word on the merge `request` asks about, with `running` the epoch
    /// running now (if known).
    pub(crate) fn answer(
        &self,
        request: &ConfirmationRequest,
        running: Option<u64>,
    ) -> ConfirmationReply {
        let key = (request.epoch, request.stage);
        // The merge closing the epoch before the running one may still be audited
        // (and one this validator has not seen close yet).
        let recent = running.is_none_or(|running| request.epoch.saturating_add(1) >= running);
        super::confirmation::answer(
            self.audits.get(&key).copied(),
            self.merged.get(&key),
            recent,
        )
    }
}
