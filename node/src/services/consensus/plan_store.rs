//! The last adopted plan on disk: one JSON file in the data dir, written atomically. The
//! consensus task saves each plan the state adopts; a restarted node reads it back before
//! the state is built, so it continues after the last epoch, never before it.

use std::path::{Path, PathBuf};

use bootstrap::EpochPlan;

/// The last accepted plan, kept as one JSON file written atomically.
#[derive(Debug, Clone)]
pub(crate) struct PlanStore {
    path: PathBuf,
}

impl PlanStore {
    /// The store in `data_dir`.
    pub(crate) fn new(data_dir: &Path) -> Self {
        PlanStore {
            path: data_dir.join("last-plan.json"),
        }
    }

    /// The stored plan, if any.
    pub(crate) fn load(&self) -> anyhow::Result<Option<EpochPlan>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Ok(Some(EpochPlan::from_json(&bytes)?)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// The stored plan; one that cannot be read is ignored, with a warning.
    pub(crate) fn load_or_warn(&self) -> Option<EpochPlan> {
        self.load().unwrap_or_else(|error| {
            tracing::warn!(%error, "ignoring the stored plan");
            None
        })
    }

    /// Replaces the stored plan.
    pub(crate) fn save(&self, plan: &EpochPlan) -> anyhow::Result<()> {
        crate::fsio::write_atomically(&self.path, &plan.to_json()?, false)?;
        Ok(())
    }
}
