//! What a claim does with the rows its statement leased: their order (CONTRACT C3,
//! F5) and the burial of those that do not decode (C10).

use super::*;

/// A job a claim leased but could not decode (CONTRACT C10): its row's id and lease
/// token, and why.
pub(super) struct Unreadable {
    pub(super) id: Uuid,
    pub(super) token: i64,
    pub(super) reason: String,
}

/// The claimed jobs in the request's order (CONTRACT C3, F5: `UPDATE … RETURNING` has
/// none), and those of its rows that did not decode.
pub(super) fn claim_order(
    rows: Vec<PgRow>,
    request: &ClaimRequest,
) -> Result<(Vec<ClaimedJob>, Vec<Unreadable>)> {
    let mut claimed = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    let mut placements = durq_core::fit::PlacementCache::new();
    for row in rows {
        match claimed_job(&row, request, &mut placements) {
            Ok(job) => claimed.push(job),
            Err(Error::Corrupt { what, reason }) => {
                // The id and token columns are typed by the schema: they decode.
                let id: Uuid = column(&row, 0, &|| what.clone())?;
                let token: i64 = column(&row, 12, &|| what.clone())?;
                unreadable.push(Unreadable { id, token, reason });
            }
            Err(other) => return Err(other),
        }
    }
    claimed.sort_by_key(|(order, _)| *order);
    Ok((
        claimed.into_iter().map(|(_, job)| job).collect(),
        unreadable,
    ))
}

/// One row of a claim, decoded, with its place in the claim's order.
fn claimed_job(
    row: &PgRow,
    request: &ClaimRequest,
    placements: &mut durq_core::fit::PlacementCache,
) -> Result<(durq_core::fit::FitOrder, ClaimedJob)> {
    let job = row::job_in(row, Some(placements))?;
    let seq = row::seq(row, job.id)?;
    let payload: Vec<u8> = column(row, row::CLAIM_PAYLOAD, &|| format!("job {}", job.id))?;
    let order = request.fit_order(
        ReadyOrder::new(job.priority, job.run_at, seq),
        job.locality.as_deref(),
    );
    Ok((
        order,
        ClaimedJob {
            job,
            payload: Bytes::from(payload),
        },
    ))
}
