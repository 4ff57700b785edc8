//! Per-member traffic of an honest merge for N = 2, 4, 8, 16.
//!
//! Formula (module docs): member `m` receives `(N − 1)·|p|` values for each partition `p`
//! it holds and `|p|` for each other one, which is `(3 − 4/N)·L` values with a balanced plan,
//! and sends as much; gossip and request headers add `O(N·P)` hashes on top.

use super::*;

const LEN: usize = 1 << 18;
const PARTITIONS: usize = 32;

/// Values member `m` must receive as partition data.
fn data_values(plan: &Plan, m: usize) -> usize {
    let n = plan.members().len();
    (0..plan.partitions())
        .map(|p| {
            let size = plan.range(p).len();
            if plan.is_holder(p, m) {
                (n - 1) * size
            } else {
                size
            }
        })
        .sum()
}

#[tokio::test]
async fn per_member_bytes_stay_near_three_vectors_whatever_the_number_of_members() {
    let vector_bytes = (4 * LEN) as f64;
    let mut worst = Vec::new();
    println!("N  formula  in/vector(max)  out/vector(max)  report/network");
    for n in [2usize, 4, 8, 16] {
        let swarm = Swarm::with_phase(n, PARTITIONS, LEN, Duration::from_secs(5));
        let everyone = swarm.all_but(&[]);
        let outcomes = swarm.run(&everyone).await;
        let formula = 3.0 - 4.0 / n as f64;
        let (mut max_in, mut max_out) = (0f64, 0f64);
        let mut min_report_share = 1f64;
        for &m in &everyone {
            let counted = swarm.network.bytes(swarm.id(m));
            let data = 4.0 * data_values(&swarm.plan, m) as f64;
            // The balanced plan (2P a multiple of N) gives every member exactly the formula.
            assert!(
                (data / vector_bytes - formula).abs() < 1e-9,
                "N={n} member {m}"
            );
            let received = counted.received as f64;
            let sent = counted.sent as f64;
            assert!(received >= data, "N={n} member {m}: {received} < {data}");
            assert!(
                received <= data + 0.08 * vector_bytes,
                "N={n} member {m}: overhead {} bytes",
                received - data
            );
            assert!(
                sent <= data + 0.08 * vector_bytes,
                "N={n} member {m}: sent {sent}"
            );
            let report = &outcome(&outcomes, m).report;
            assert!(report.bytes_received as f64 <= received);
            min_report_share = min_report_share.min(report.bytes_received as f64 / received);
            max_in = max_in.max(received / vector_bytes);
            max_out = max_out.max(sent / vector_bytes);
        }
        assert!(
            min_report_share > 0.95,
            "N={n}: report counts {min_report_share} of the wire bytes"
        );
        assert_eq!(swarm.network.dropped_gossip(), 0);
        println!("{n:<2} {formula:>8.3} {max_in:>15.3} {max_out:>16.3} {min_report_share:>15.3}");
        worst.push(max_in);
    }
    // Bounded whatever N (the design goal is 3.5), and growing only as 3 − 4/N does.
    assert!(worst.iter().all(|r| *r <= 3.1), "{worst:?}");
    assert!(worst[3] - worst[2] < 0.35, "{worst:?}");
}
