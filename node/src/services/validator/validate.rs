//! The rules of the requests a validator's word or a miner's evidence is asked with, pure
//! and unit-tested:
//!
//! * **Spot check**: only a permitted validator of the metagraph may spot-check a miner (the
//!   evidence — inputs, outputs and the whole stage's weights — is costly to assemble and
//!   large, so no one else gets it).
//! * **Confirmation**: a validator's word on a merge, to anyone who asks (it is public: the
//!   members gossiped the hashes); a node that is not a validator refuses.

use bootstrap::PeerIdStr;
use std::collections::BTreeSet;

use crate::rules::Refusal;
use crate::wire::messages::{self, ConfirmationRequest, Service};

/// Checks that `sender` may spot-check this miner: a permitted validator of the metagraph.
pub(crate) fn check_spot_check(
    validators: &BTreeSet<PeerIdStr>,
    sender: &str,
) -> Result<(), Refusal> {
    if validators.contains(sender) {
        Ok(())
    } else {
        Err(Refusal::NotValidator)
    }
}

/// Checks a spot-check request of `sender`: it decodes, and `sender` may ask.
pub(crate) fn spot_check_request(
    validators: &BTreeSet<PeerIdStr>,
    sender: &str,
    data: &[u8],
) -> Result<(), Refusal> {
    messages::decode::<messages::SpotCheckRequest>(Service::SpotCheck, data)
        .map_err(|_| Refusal::FrameMalformed)?;
    check_spot_check(validators, sender)
}

/// Checks a confirmation request on a node that is (`served`) or is not a validator.
pub(crate) fn confirmation_request(
    served: bool,
    data: &[u8],
) -> Result<ConfirmationRequest, Refusal> {
    if !served {
        return Err(Refusal::NotServed);
    }
    messages::decode::<ConfirmationRequest>(Service::Confirmation, data)
        .map(|(request, _)| request)
        .map_err(|_| Refusal::FrameMalformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::consensus::api::fixture::{book, on, peer};

    #[test]
    fn spot_checks_are_answered_only_to_permitted_validators() {
        let (book, _) = book(&[3]);
        let plan = book.get(3).unwrap();
        let validator = peer(200).to_string();
        let validators: BTreeSet<PeerIdStr> = [PeerIdStr::parse(&validator).unwrap()].into();
        assert_eq!(check_spot_check(&validators, &validator), Ok(()));
        // Neither a miner of the plan nor a stranger may ask for a miner's evidence.
        let miner = on(plan, 1)[0].clone();
        assert_eq!(
            check_spot_check(&validators, &miner),
            Err(Refusal::NotValidator)
        );
        assert_eq!(
            check_spot_check(&validators, peer(201).as_str()),
            Err(Refusal::NotValidator)
        );
        assert_eq!(
            check_spot_check(&BTreeSet::new(), &validator),
            Err(Refusal::NotValidator)
        );
    }

    #[test]
    fn confirmations_are_answered_only_by_validators() {
        assert_eq!(
            confirmation_request(false, b"").unwrap_err(),
            Refusal::NotServed
        );
        assert_eq!(
            confirmation_request(true, b"not a request").unwrap_err(),
            Refusal::FrameMalformed
        );
    }
}
