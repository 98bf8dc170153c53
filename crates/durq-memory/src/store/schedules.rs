//! Stored schedules (CONTRACT S1–S3).

use super::*;

impl State {
    /// Rule S1: a new schedule starts enabled at `now`; a known one keeps both.
    pub(crate) fn put_schedule(&mut self, name: &str, spec: &str, now: Timestamp) {
        self.schedules
            .entry(name.to_owned())
            .and_modify(|stored| stored.spec = spec.to_owned())
            .or_insert_with(|| StoredSchedule {
                name: name.to_owned(),
                spec: spec.to_owned(),
                enabled: true,
                last_tick: now,
            });
    }

    pub(crate) fn schedules(&self) -> Vec<StoredSchedule> {
        self.schedules.values().cloned().collect()
    }

    /// Rule S2: only what `update` sets changes; the last tick only moves forward.
    pub(crate) fn update_schedule(&mut self, name: &str, update: ScheduleUpdate) -> Result<()> {
        let stored = self
            .schedules
            .get_mut(name)
            .ok_or_else(|| Error::ScheduleNotFound {
                name: name.to_owned(),
            })?;
        if let Some(enabled) = update.enabled {
            stored.enabled = enabled;
        }
        if let Some(tick) = update.last_tick {
            stored.last_tick = stored.last_tick.max(tick);
        }
        Ok(())
    }

    pub(crate) fn delete_schedule(&mut self, name: &str) -> bool {
        self.schedules.remove(name).is_some()
    }
}
