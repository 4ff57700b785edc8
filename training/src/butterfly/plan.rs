//! The merge plan: which slice of the flat parameter vector each partition covers and which
//! two members hold it.
//!
//! Guarantees, for any valid input (checked by the property tests below):
//! - the partition ranges are contiguous, cover `0..len` exactly, and their sizes differ by at
//!   most one (the first `len % P` partitions are one longer);
//! - with `N ≥ 2` members every partition has two distinct holders, and every member holds
//!   `⌊2P/N⌋` or `⌈2P/N⌉` partitions (so counts differ by at most one). With `P ≥ N/2` every
//!   member holds at least one partition; with `P < N/2` some hold none, and they only
//!   serve their inputs and fetch averages. Choose `P` a multiple of `N/2` for exact balance.
//! - with `N = 1` the single member is recorded as both holders of every partition and the
//!   merge is a no-op ([`Plan::is_trivial`]);
//! - holders are drawn by a seeded shuffle (ChaCha20 keyed by blake3 of the epoch seed, `N`
//!   and `P`), which the members do not control: nobody picks a partner;
//! - the plan depends only on `(seed, set of members, P, len)`: the order in which members are
//!   given does not matter, so every node computes the same plan, and [`verify`] rejects a
//!   claimed plan that differs from the one those inputs give.

use std::ops::Range;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use super::MemberId;

/// Most members a stage merge accepts (bounds claim sizes: a claim lists every included
/// member, and must fit one gossip envelope).
pub const MAX_MEMBERS: usize = 256;
/// Most partitions a plan may cut the vector into (bounds commitment sizes the same way).
pub const MAX_PARTITIONS: usize = 1024;
/// Longest member id, in bytes (a base58 libp2p peer id is about 52).
pub const MAX_MEMBER_ID_BYTES: usize = 128;

/// Key-derivation context for the holder shuffle; changing it changes every plan.
const PLAN_CONTEXT: &str = "iota-p2p butterfly plan v1";

/// Who holds what in one merge of one stage. Build it with [`plan`]; check a received
/// (deserialised) one with [`verify`] before use: the accessors index by partition and
/// member like slices do, and panic out of range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    seed: u64,
    members: Vec<MemberId>,
    len: usize,
    ranges: Vec<Range<usize>>,
    holders: Vec<[usize; 2]>,
}

/// Why a plan cannot be built from the given inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// No members were given.
    #[error("a merge needs at least one member")]
    NoMembers,
    /// More members than [`MAX_MEMBERS`].
    #[error("{count} members, at most {max} allowed")]
    TooManyMembers {
        /// Members given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The same member id appears twice.
    #[error("member {0:?} is listed twice")]
    DuplicateMember(MemberId),
    /// A member id is empty or longer than [`MAX_MEMBER_ID_BYTES`].
    #[error("member id {0:?} is empty or too long")]
    BadMemberId(MemberId),
    /// `P = 0`.
    #[error("a plan needs at least one partition")]
    ZeroPartitions,
    /// More partitions than [`MAX_PARTITIONS`].
    #[error("{partitions} partitions, at most {max} allowed")]
    TooManyPartitions {
        /// Partitions asked for.
        partitions: usize,
        /// The limit.
        max: usize,
    },
    /// The vector is shorter than the number of partitions, so some would be empty.
    #[error("vector of {len} values cannot be cut into {partitions} non-empty partitions")]
    VectorTooShort {
        /// Vector length.
        len: usize,
        /// Partitions asked for.
        partitions: usize,
    },
}

/// Why a claimed plan was rejected by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The claimed plan's own inputs (members, partition count, length) are invalid.
    #[error("claimed plan has invalid inputs: {0}")]
    Inputs(#[from] PlanError),
    /// The member list is not the sorted, duplicate-free list.
    #[error("member list is not in canonical (sorted) order")]
    MemberOrder,
    /// The holders list does not have one entry per partition.
    #[error("claimed plan has {holders} holder pairs for {partitions} partitions")]
    Shape {
        /// Holder pairs claimed.
        holders: usize,
        /// Partitions claimed.
        partitions: usize,
    },
    /// A partition's range differs from the canonical one.
    #[error("partition {partition} has the wrong range")]
    Range {
        /// The first partition that differs.
        partition: usize,
    },
    /// A partition's holders differ from the ones the seed draws.
    #[error("partition {partition} has the wrong holders")]
    Holders {
        /// The first partition that differs.
        partition: usize,
    },
}

/// Builds the plan for `members` (any order; sorted internally) cutting a vector of `len`
/// values into `partitions` parts, holders drawn from `seed`. Mix the stage into the seed
/// if different stages should get different pairings.
pub fn plan(
    seed: u64,
    members: &[MemberId],
    partitions: usize,
    len: usize,
) -> Result<Plan, PlanError> {
    if members.is_empty() {
        return Err(PlanError::NoMembers);
    }
    if members.len() > MAX_MEMBERS {
        return Err(PlanError::TooManyMembers {
            count: members.len(),
            max: MAX_MEMBERS,
        });
    }
    if let Some(bad) = members
        .iter()
        .find(|m| m.is_empty() || m.len() > MAX_MEMBER_ID_BYTES)
    {
        return Err(PlanError::BadMemberId(bad.clone()));
    }
    if partitions == 0 {
        return Err(PlanError::ZeroPartitions);
    }
    if partitions > MAX_PARTITIONS {
        return Err(PlanError::TooManyPartitions {
            partitions,
            max: MAX_PARTITIONS,
        });
    }
    if len < partitions {
        return Err(PlanError::VectorTooShort { len, partitions });
    }
    let mut sorted = members.to_vec();
    sorted.sort();
    if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(PlanError::DuplicateMember(pair[0].clone()));
    }
    let holders = assign_holders(seed, sorted.len(), partitions);
    Ok(Plan {
        seed,
        members: sorted,
        len,
        ranges: split(len, partitions),
        holders,
    })
}

/// Checks that `claimed` is exactly the plan its own seed, members, partition count and
/// length give.
pub fn verify(claimed: &Plan) -> Result<(), VerifyError> {
    if claimed.holders.len() != claimed.ranges.len() {
        return Err(VerifyError::Shape {
            holders: claimed.holders.len(),
            partitions: claimed.ranges.len(),
        });
    }
    let canonical = plan(
        claimed.seed,
        &claimed.members,
        claimed.ranges.len(),
        claimed.len,
    )?;
    if canonical.members != claimed.members {
        return Err(VerifyError::MemberOrder);
    }
    if let Some(partition) =
        (0..canonical.ranges.len()).find(|&p| canonical.ranges[p] != claimed.ranges[p])
    {
        return Err(VerifyError::Range { partition });
    }
    if let Some(partition) =
        (0..canonical.holders.len()).find(|&p| canonical.holders[p] != claimed.holders[p])
    {
        return Err(VerifyError::Holders { partition });
    }
    Ok(())
}

impl Plan {
    /// The epoch seed the holders were drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Members, sorted; a member's index in this list is its index everywhere in the plan.
    pub fn members(&self) -> &[MemberId] {
        &self.members
    }

    /// The id of member `index`.
    pub fn member(&self, index: usize) -> &str {
        &self.members[index]
    }

    /// The index of `member`, if it is in the plan.
    pub fn index_of(&self, member: &str) -> Option<usize> {
        self.members
            .binary_search_by(|m| m.as_str().cmp(member))
            .ok()
    }

    /// Length of the flat vector being merged.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a plan covers at least one value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of partitions `P`.
    pub fn partitions(&self) -> usize {
        self.ranges.len()
    }

    /// The slice of the vector partition `p` covers.
    pub fn range(&self, p: usize) -> Range<usize> {
        self.ranges[p].clone()
    }

    /// The two holders (member indices, ascending) of partition `p`; equal only when
    /// [`Plan::is_trivial`].
    pub fn holders(&self, p: usize) -> [usize; 2] {
        self.holders[p]
    }

    /// Whether member `index` holds partition `p`.
    pub fn is_holder(&self, p: usize, index: usize) -> bool {
        self.holders[p].contains(&index)
    }

    /// Partitions held by member `index`, ascending.
    pub fn held_by(&self, index: usize) -> Vec<usize> {
        (0..self.partitions())
            .filter(|&p| self.is_holder(p, index))
            .collect()
    }

    /// True when there is a single member: the merge changes nothing and sends nothing.
    pub fn is_trivial(&self) -> bool {
        self.members.len() == 1
    }
}

/// Cuts `0..len` into `parts` contiguous ranges whose sizes differ by at most one.
fn split(len: usize, parts: usize) -> Vec<Range<usize>> {
    let base = len / parts;
    let longer = len % parts;
    let mut start = 0;
    (0..parts)
        .map(|p| {
            let size = base + usize::from(p < longer);
            let range = start..start + size;
            start += size;
            range
        })
        .collect()
}

/// Deals `2P` holder slots round by round: each round is a fresh seeded permutation of all
/// members, so every member gets one slot per full round (balance within one), and
/// consecutive slots, which form a partition's pair, are distinct inside a round. Where a
/// pair straddles two rounds, the next round's first two entries are swapped if needed.
fn assign_holders(seed: u64, n: usize, partitions: usize) -> Vec<[usize; 2]> {
    if n == 1 {
        return vec![[0, 0]; partitions];
    }
    let mut rng = plan_rng(seed, n, partitions);
    let slots = 2 * partitions;
    let mut order: Vec<usize> = Vec::with_capacity(slots);
    while order.len() < slots {
        let mut round = shuffled(&mut rng, n);
        if order.last() == Some(&round[0]) {
            round.swap(0, 1);
        }
        let take = (slots - order.len()).min(n);
        order.extend_from_slice(&round[..take]);
    }
    order
        .chunks_exact(2)
        .map(|pair| [pair[0].min(pair[1]), pair[0].max(pair[1])])
        .collect()
}

fn plan_rng(seed: u64, n: usize, partitions: usize) -> ChaCha20Rng {
    let mut hasher = blake3::Hasher::new_derive_key(PLAN_CONTEXT);
    hasher.update(&seed.to_le_bytes());
    hasher.update(&(n as u64).to_le_bytes());
    hasher.update(&(partitions as u64).to_le_bytes());
    ChaCha20Rng::from_seed(*hasher.finalize().as_bytes())
}

/// Fisher–Yates over `0..n` with a multiply-shift draw, written out so that the plan does
/// not depend on the value stability of a library's shuffle.
fn shuffled(rng: &mut ChaCha20Rng, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = below(rng, i + 1);
        v.swap(i, j);
    }
    v
}

/// A draw in `0..bound` (`bound ≥ 1`); the bias is below 2^-50 for any bound we use.
pub(crate) fn below(rng: &mut ChaCha20Rng, bound: usize) -> usize {
    ((u128::from(rng.next_u64()) * bound as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<MemberId> {
        (0..n).map(|i| format!("peer-{i:03}")).collect()
    }

    fn load(plan: &Plan) -> Vec<usize> {
        (0..plan.members().len())
            .map(|m| plan.held_by(m).len())
            .collect()
    }

    proptest! {
        #[test]
        fn ranges_are_contiguous_and_balanced(
            seed in any::<u64>(), n in 1usize..40, parts in 1usize..200, extra in 0usize..500,
        ) {
            let len = parts + extra;
            let plan = plan(seed, &ids(n), parts, len).unwrap();
            let mut next = 0;
            let sizes: Vec<usize> = (0..parts).map(|p| plan.range(p).len()).collect();
            for p in 0..parts {
                prop_assert_eq!(plan.range(p).start, next);
                next = plan.range(p).end;
            }
            prop_assert_eq!(next, len);
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(*min >= 1 && max - min <= 1);
        }

        #[test]
        fn holders_are_distinct_and_load_is_within_one(
            seed in any::<u64>(), n in 2usize..40, parts in 1usize..200,
        ) {
            let plan = plan(seed, &ids(n), parts, parts * 3).unwrap();
            for p in 0..parts {
                let [a, b] = plan.holders(p);
                prop_assert!(a < b && b < n);
            }
            let load = load(&plan);
            let (min, max) = (*load.iter().min().unwrap(), *load.iter().max().unwrap());
            prop_assert!(max - min <= 1, "load {load:?}");
            prop_assert_eq!(load.iter().sum::<usize>(), 2 * parts);
            if 2 * parts >= n {
                prop_assert!(min >= 1, "P >= N/2 but some member holds nothing: {load:?}");
            }
        }

        #[test]
        fn same_inputs_in_any_order_give_the_same_plan(
            seed in any::<u64>(), n in 1usize..30, parts in 1usize..64, rotate in 0usize..30,
        ) {
            let members = ids(n);
            let mut shuffled = members.clone();
            shuffled.reverse();
            shuffled.rotate_left(rotate % n);
            let a = plan(seed, &members, parts, parts * 2).unwrap();
            let b = plan(seed, &shuffled, parts, parts * 2).unwrap();
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(verify(&a), Ok(()));
        }

        #[test]
        fn verify_rejects_a_tampered_holder(
            seed in any::<u64>(), n in 3usize..30, parts in 1usize..64, pick in any::<usize>(),
        ) {
            let honest = plan(seed, &ids(n), parts, parts).unwrap();
            let p = pick % parts;
            let mut claimed = honest.clone();
            let [a, b] = claimed.holders[p];
            // Replace one holder by a member that is neither of the drawn two.
            let other = (0..n).find(|m| *m != a && *m != b).unwrap();
            claimed.holders[p] = [a.min(other), a.max(other)];
            prop_assert_eq!(verify(&claimed), Err(VerifyError::Holders { partition: p }));
        }
    }

    #[test]
    fn single_member_holds_everything_and_plan_is_trivial() {
        let plan = plan(7, &ids(1), 4, 10).unwrap();
        assert!(plan.is_trivial());
        assert!((0..4).all(|p| plan.holders(p) == [0, 0]));
        assert_eq!(verify(&plan), Ok(()));
    }

    #[test]
    fn partners_vary_with_the_seed() {
        // With N = 8 and P = 4 each member holds exactly one partition; over many epochs
        // member 0 must meet most of the others as partner, i.e. the seed, not the member,
        // decides the pairing.
        let members = ids(8);
        let mut partners = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let plan = plan(seed, &members, 4, 4).unwrap();
            let p = plan.held_by(0)[0];
            let [a, b] = plan.holders(p);
            partners.insert(if a == 0 { b } else { a });
        }
        assert!(partners.len() >= 6, "partners of member 0: {partners:?}");
    }

    #[test]
    fn invalid_inputs_are_typed_errors() {
        assert_eq!(plan(1, &[], 1, 1), Err(PlanError::NoMembers));
        assert_eq!(plan(1, &ids(2), 0, 1), Err(PlanError::ZeroPartitions));
        assert_eq!(
            plan(1, &ids(2), 5, 4),
            Err(PlanError::VectorTooShort {
                len: 4,
                partitions: 5
            })
        );
        let dup = vec!["a".to_string(), "b".to_string(), "a".to_string()];
        assert_eq!(
            plan(1, &dup, 1, 1),
            Err(PlanError::DuplicateMember("a".into()))
        );
        assert_eq!(
            plan(1, &[String::new()], 1, 1),
            Err(PlanError::BadMemberId(String::new()))
        );
        assert!(matches!(
            plan(1, &ids(2), MAX_PARTITIONS + 1, usize::MAX),
            Err(PlanError::TooManyPartitions { .. })
        ));
    }

    #[test]
    fn verify_rejects_unsorted_members_and_bad_shape() {
        let honest = plan(3, &ids(4), 4, 8).unwrap();
        let mut unsorted = honest.clone();
        unsorted.members.swap(0, 1);
        assert_eq!(verify(&unsorted), Err(VerifyError::MemberOrder));
        let mut short = honest.clone();
        short.holders.pop();
        assert!(matches!(verify(&short), Err(VerifyError::Shape { .. })));
        let mut moved = honest;
        moved.ranges[0].end += 1;
        moved.ranges[1].start += 1;
        assert_eq!(verify(&moved), Err(VerifyError::Range { partition: 0 }));
    }
}
