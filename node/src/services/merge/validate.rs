//! Who may speak in a butterfly merge, pure and unit-tested: a member of that stage in the
//! epoch's plan (commitments, slice hashes, reports) or a validator (audit reports). A
//! merge this node holds no plan for is not judged: its gossip is ignored, neither delivered
//! nor relayed.

use bootstrap::PeerIdStr;

use crate::rules::{Reason, Verdict};
use crate::services::merge::api::Readers;

/// Why butterfly gossip was refused before the all-reduce's own checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ButterflyReason {
    /// The author is neither a member of that merge's stage nor a validator.
    NotMember,
    /// This node holds no plan for that merge.
    UnknownMerge,
}

impl Reason for ButterflyReason {
    fn label(&self) -> &'static str {
        match self {
            ButterflyReason::NotMember => "butterfly_not_member",
            ButterflyReason::UnknownMerge => "butterfly_unknown_merge",
        }
    }
}

/// Checks that `author` may speak in the butterfly merge of `stage` closing `epoch`: a
/// member of that stage in the epoch's plan (commitments, slice hashes, reports) or a
/// validator (audit reports). A merge this node holds no plan for is not judged: its
/// gossip is ignored, neither delivered nor relayed.
pub(crate) fn check_butterfly_author(
    readers: &Readers,
    author: &PeerIdStr,
    epoch: u64,
    stage: u32,
) -> Verdict<ButterflyReason> {
    if readers.validators.contains(author) {
        return Verdict::Accept;
    }
    match readers.members.get(&(epoch, stage)) {
        Some(members) if members.contains(author) => Verdict::Accept,
        Some(_) => Verdict::Reject(ButterflyReason::NotMember),
        None => Verdict::Ignore(ButterflyReason::UnknownMerge),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::services::consensus::api::fixture::{book, peer};

    #[test]
    fn butterfly_gossip_comes_from_that_merges_members_or_validators() {
        let (book, peers) = book(&[4]);
        let plan = book.get(4).unwrap();
        let members: BTreeSet<PeerIdStr> = plan.miners_of(1).cloned().collect();
        let outsider = peer(200);
        let validator = peer(201);
        let readers = Readers {
            members: [((4, 1), members.clone())].into_iter().collect(),
            validators: [validator.clone()].into_iter().collect(),
        };
        let member = members.iter().next().unwrap();
        assert_eq!(
            check_butterfly_author(&readers, member, 4, 1),
            Verdict::Accept
        );
        assert_eq!(
            check_butterfly_author(&readers, &validator, 4, 1),
            Verdict::Accept
        );
        assert_eq!(
            check_butterfly_author(&readers, &outsider, 4, 1),
            Verdict::Reject(ButterflyReason::NotMember)
        );
        // A member of stage 1 is not a member of stage 0's merge.
        let on_stage0: BTreeSet<PeerIdStr> = plan.miners_of(0).cloned().collect();
        let readers0 = Readers {
            members: [((4, 0), on_stage0)].into_iter().collect(),
            ..Readers::default()
        };
        assert_eq!(
            check_butterfly_author(&readers0, member, 4, 0),
            Verdict::Reject(ButterflyReason::NotMember)
        );
        // No plan for that merge: not judged, not delivered.
        assert_eq!(
            check_butterfly_author(&readers, member, 9, 1),
            Verdict::Ignore(ButterflyReason::UnknownMerge)
        );
        assert!(peers.len() > 2);
    }
}
