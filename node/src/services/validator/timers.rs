//! The validator task's own timers: a queue of deadlines it sleeps on in its `select!`
//! (pure: the time is passed in), instead of a detached sleep per delayed message.

use std::collections::BTreeMap;

use tokio::time::Instant;

/// Items due at deadlines, handed out in deadline order (equal deadlines in the order
/// they were added).
#[derive(Debug)]
pub(crate) struct Deadlines<T> {
    queue: BTreeMap<(Instant, u64), T>,
    added: u64,
}

impl<T> Default for Deadlines<T> {
    fn default() -> Self {
        Deadlines {
            queue: BTreeMap::new(),
            added: 0,
        }
    }
}

impl<T> Deadlines<T> {
    /// Adds `item`, due at `at`.
    pub(crate) fn push(&mut self, at: Instant, item: T) {
        self.queue.insert((at, self.added), item);
        self.added += 1;
    }

    /// The earliest deadline, if any.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.queue.first_key_value().map(|((at, _), _)| *at)
    }

    /// The earliest item due at `now`, if any.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<T> {
        let entry = self.queue.first_entry()?;
        if entry.key().0 > now {
            return None;
        }
        Some(entry.remove())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn items_come_due_in_deadline_order_and_not_before() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut deadlines = Deadlines::default();
        assert_eq!(deadlines.next(), None);
        deadlines.push(at(3000), "score");
        deadlines.push(at(700), "tick");
        deadlines.push(at(3000), "score again");
        assert_eq!(deadlines.next(), Some(at(700)));
        assert_eq!(deadlines.pop_due(at(699)), None);
        assert_eq!(deadlines.pop_due(at(700)), Some("tick"));
        assert_eq!(deadlines.pop_due(at(2000)), None);
        assert_eq!(deadlines.next(), Some(at(3000)));
        assert_eq!(deadlines.pop_due(at(5000)), Some("score"));
        assert_eq!(deadlines.pop_due(at(5000)), Some("score again"));
        assert_eq!(deadlines.pop_due(at(5000)), None);
        assert_eq!(deadlines.next(), None);
    }
}
