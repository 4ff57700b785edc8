//! A validator's word on a merge, for the replicas that join a stage: which merged hash its
//! audit of the merge confirmed (pure).
//!
//! A joiner loads a stage's merged snapshot by the hash its members gossiped; members can
//! collude on that hash, so the joiner also asks the validators, each of which audited the
//! merge (recomputed a sample of its partitions from the members' committed inputs, see
//! `training::butterfly::audit`) and heard the members' hashes. [`answer`] is what one
//! validator says; [`decide`] is what the joiner makes of every validator's answer.

use std::collections::BTreeSet;

use crate::services::merge::api::AuditVerdict;
use crate::wire::messages::ConfirmationReply;

/// A validator's answer about one merge: `verdict` of its audit (`None`: not ended or not
/// started), the members' gossiped `hashes`, and whether the merge is `recent` enough that
/// either may still arrive.
pub(crate) fn answer(
    verdict: Option<AuditVerdict>,
    hashes: Option<&BTreeSet<String>>,
    recent: bool,
) -> ConfirmationReply {
    let hashes: Vec<&String> = hashes.into_iter().flatten().collect();
    match verdict {
        Some(AuditVerdict::Caught) => return ConfirmationReply::Caught,
        Some(AuditVerdict::Incomplete) => return ConfirmationReply::Unaudited,
        _ => {}
    }
    if hashes.len() > 1 {
        return ConfirmationReply::Disputed;
    }
    match (verdict, hashes.first()) {
        (Some(AuditVerdict::Clean), Some(hash)) => ConfirmationReply::Confirmed {
            hash: (*hash).clone(),
        },
        _ if recent => ConfirmationReply::Pending,
        _ => ConfirmationReply::Unaudited,
    }
}

/// What a joiner makes of the validators' answers about the merge whose members gossiped
/// `expected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// This validator confirmed `expected`.
    Confirmed(String),
    /// A validator's audit is still running: ask again.
    Wait,
    /// No validator confirmed `expected` and one refuted it (another hash, a member named,
    /// members in disagreement): do not load it.
    Refuted(&'static str),
    /// No validator audited the merge (none answered, or none audited it): the members'
    /// word is all there is.
    Unconfirmed,
}

/// Judges `answers` (validator, reply) about a merge whose members gossiped `expected`. One
/// confirmation is enough: a validator that lies about a merge cannot keep a joiner from
/// the honest validators' word.
pub(crate) fn decide(answers: &[(String, ConfirmationReply)], expected: &str) -> Decision {
    if let Some((validator, _)) = answers
        .iter()
        .find(|(_, a)| matches!(a, ConfirmationReply::Confirmed { hash } if hash == expected))
    {
        return Decision::Confirmed(validator.clone());
    }
    if answers
        .iter()
        .any(|(_, a)| *a == ConfirmationReply::Pending)
    {
        return Decision::Wait;
    }
    for (_, a) in answers {
        match a {
            ConfirmationReply::Confirmed { .. } => return Decision::Refuted("another_hash"),
            ConfirmationReply::Caught => return Decision::Refuted("member_caught"),
            ConfirmationReply::Disputed => return Decision::Refuted("members_disagree"),
            ConfirmationReply::Pending | ConfirmationReply::Unaudited => {}
        }
    }
    Decision::Unconfirmed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(h: &[&str]) -> BTreeSet<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_validator_confirms_only_a_clean_audit_of_members_that_agree() {
        let one = hashes(&["aa"]);
        let two = hashes(&["aa", "bb"]);
        let clean = Some(AuditVerdict::Clean);
        assert_eq!(
            answer(clean, Some(&one), true),
            ConfirmationReply::Confirmed { hash: "aa".into() }
        );
        assert_eq!(
            answer(Some(AuditVerdict::Caught), Some(&one), true),
            ConfirmationReply::Caught
        );
        assert_eq!(answer(clean, Some(&two), true), ConfirmationReply::Disputed);
        assert_eq!(
            answer(Some(AuditVerdict::Incomplete), Some(&one), true),
            ConfirmationReply::Unaudited
        );
        // Not in yet: the audit, or the members' hashes.
        assert_eq!(answer(None, Some(&one), true), ConfirmationReply::Pending);
        assert_eq!(answer(clean, None, true), ConfirmationReply::Pending);
        // Too old to arrive any more.
        assert_eq!(
            answer(None, Some(&one), false),
            ConfirmationReply::Unaudited
        );
        assert_eq!(answer(clean, None, false), ConfirmationReply::Unaudited);
    }

    #[test]
    fn a_joiner_needs_one_confirmation_and_refuses_a_refuted_hash() {
        let v = |name: &str, reply: ConfirmationReply| (name.to_string(), reply);
        let confirmed = |h: &str| ConfirmationReply::Confirmed { hash: h.into() };
        assert_eq!(
            decide(&[v("a", confirmed("aa"))], "aa"),
            Decision::Confirmed("a".into())
        );
        // A lying validator does not outweigh an honest one's confirmation.
        assert_eq!(
            decide(&[v("liar", confirmed("bb")), v("b", confirmed("aa"))], "aa"),
            Decision::Confirmed("b".into())
        );
        assert_eq!(
            decide(&[v("a", confirmed("bb"))], "aa"),
            Decision::Refuted("another_hash")
        );
        assert_eq!(
            decide(&[v("a", ConfirmationReply::Caught)], "aa"),
            Decision::Refuted("member_caught")
        );
        assert_eq!(
            decide(&[v("a", ConfirmationReply::Disputed)], "aa"),
            Decision::Refuted("members_disagree")
        );
        // One audit still running: wait for it before refusing.
        assert_eq!(
            decide(
                &[
                    v("a", ConfirmationReply::Pending),
                    v("b", ConfirmationReply::Caught)
                ],
                "aa"
            ),
            Decision::Wait
        );
        assert_eq!(
            decide(&[v("a", ConfirmationReply::Unaudited)], "aa"),
            Decision::Unconfirmed
        );
        assert_eq!(decide(&[], "aa"), Decision::Unconfirmed);
    }
}
