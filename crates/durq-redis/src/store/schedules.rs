//! Stored schedules (CONTRACT S1, S2): put, update and delete, each one `schedule.lua`
//! call, and the read of every schedule.

use std::collections::HashMap;

use durq_core::{Error, Result, ScheduleUpdate, StoredSchedule, Timestamp};

use super::RedisBackend;
use crate::codec::int;
use crate::conn::map_err;
use crate::scripts;

impl RedisBackend {
    /// Rule S1: a new schedule starts enabled at `now`; a known one keeps both.
    pub(crate) async fn save_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        self.write_schedule("put", name, spec, &now.as_millis().to_string())
            .await
            .map(drop)
    }

    /// Rule S2: only what `update` sets changes; the last tick only moves forward. An
    /// unknown name is `ScheduleNotFound`.
    pub(crate) async fn change_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        let enabled = match update.enabled {
            Some(true) => "1",
            Some(false) => "0",
            None => "",
        };
        let tick = update
            .last_tick
            .map(|t| t.as_millis().to_string())
            .unwrap_or_default();
        if self.write_schedule("update", name, enabled, &tick).await? {
            Ok(())
        } else {
            Err(Error::ScheduleNotFound {
                name: name.to_owned(),
            })
        }
    }

    /// Rule S1: whether the schedule existed.
    pub(crate) async fn remove_schedule(&self, name: &str) -> Result<bool> {
        self.write_schedule("delete", name, "", "").await
    }

    /// Rules S1, S2: one `schedule.lua` call; false when the schedule was unknown.
    async fn write_schedule(
        &self,
        op: &str,
        name: &str,
        third: &str,
        fourth: &str,
    ) -> Result<bool> {
        let keys = self.keys();
        let mut invocation = scripts::SCHEDULE.prepare_invoke();
        invocation
            .key(&keys.cron_specs)
            .key(&keys.cron_enabled)
            .key(&keys.cron_last)
            .arg(op)
            .arg(name)
            .arg(third)
            .arg(fourth);
        let reply = self.invoke(&invocation, "schedule").await?;
        Ok(int(&reply, "schedule reply")? == 1)
    }

    /// Rule S1: every schedule, by name. The three hashes are read in one pipeline; a
    /// schedule deleted or written between them reads as it was before or after.
    pub(crate) async fn read_schedules(&self) -> Result<Vec<StoredSchedule>> {
        let keys = self.keys();
        let (specs, enabled, last): (
            HashMap<String, String>,
            HashMap<String, String>,
            HashMap<String, String>,
        ) = redis::pipe()
            .hgetall(&keys.cron_specs)
            .hgetall(&keys.cron_enabled)
            .hgetall(&keys.cron_last)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("schedules", err))?;
        let mut schedules = Vec::with_capacity(specs.len());
        for (name, spec) in specs {
            let what = || format!("schedule {name}");
            let on = match enabled.get(&name).map(String::as_str) {
                Some("1") => true,
                Some("0") => false,
                other => return Err(Error::corrupt(what(), format!("enabled flag {other:?}"))),
            };
            let tick = last
                .get(&name)
                .and_then(|t| t.parse::<i64>().ok())
                .ok_or_else(|| Error::corrupt(what(), "last tick missing or not a number"))?;
            schedules.push(StoredSchedule {
                name,
                spec,
                enabled: on,
                last_tick: Timestamp::from_millis(tick),
            });
        }
        schedules.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(schedules)
    }
}
