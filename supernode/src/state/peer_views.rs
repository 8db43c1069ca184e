//! What the supernode shows of its peers and serves them: the modules and
//! resources of their jobs, the peer list, the `/metrics` gauges.

use super::*;

impl Core {
    /// The bytes of module `hash`, if `peer` runs (or ran) a job of it.
    pub(crate) fn module_for_peer(&self, peer: PeerId, hash: &str) -> Result<Vec<u8>, Error> {
        let hash = hash.to_ascii_lowercase();
        let bytes: Option<Vec<u8>> = if is_hash(&hash) {
            self.conn
                .query_row(
                    "SELECT p.bytes FROM programs p WHERE p.hash = ?1 AND EXISTS ( \
                         SELECT 1 FROM jobs j JOIN job_peers jp ON jp.job = j.id \
                         WHERE j.program_hash = ?1 AND jp.peer_id = ?2)",
                    params![hash, peer],
                    |r| r.get(0),
                )
                .optional()?
        } else {
            None
        };
        bytes.ok_or_else(|| {
            Error::NotFound(format!(
                "no module `{}` for peer {peer}: peers fetch only the modules of jobs placed on them",
                truncate(&hash, 80)
            ))
        })
    }

    /// The resources of `job` in [`bsp_api::control::encode_resources`]
    /// form, for a peer the job runs on.
    pub(crate) fn resources_for_peer(&self, peer: PeerId, job: JobId) -> Result<Vec<u8>, Error> {
        let member: bool = self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM job_peers WHERE job = ?1 AND peer_id = ?2)",
            params![job, peer],
            |r| r.get(0),
        )?;
        if !member {
            return Err(Error::NotFound(format!(
                "no job {job} for peer {peer}: peers fetch only the resources of jobs placed on them"
            )));
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, data FROM job_resources WHERE job = ?1 ORDER BY name")?;
        let resources: Vec<(String, Vec<u8>)> = stmt
            .query_map([job], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<crate::sql::Result<_>>()?;
        Ok(bsp_api::control::encode_resources(&resources))
    }

    /// Every peer the supernode knows, online (and draining) first. A
    /// peer's `processes` counts those placed on it and those it still hands
    /// over to their new host.
    pub(crate) fn peers(&self) -> Result<Vec<PeerInfo>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT id, name, addr, speed, idle, cores, \
                 CASE WHEN state = 'online' AND draining = 1 THEN 'draining' ELSE state END, \
                 lease_expires_at, \
                 (SELECT count(*) FROM placements pl JOIN jobs j ON j.id = pl.job \
                  WHERE j.state = 'active' AND (pl.peer_id = peers.id OR (pl.moved_from = peers.id \
                      AND pl.moved_kind = 'migrate' AND pl.handed_over = 0))), \
                 cluster, rss_bytes, held_bytes, budget_bytes, enrollment, disabled, \
                 (SELECT u.name FROM enrollments e JOIN users u ON u.id = e.owner \
                  WHERE e.id = peers.enrollment), \
                 CASE WHEN state = 'online' THEN power END, quarantine_reason \
             FROM peers ORDER BY state != 'online', id",
        )?;
        let rows = stmt.query_map([], |r| {
            let state: String = r.get(6)?;
            // A gone peer's last report says nothing about it now.
            let memory = if state == "gone" {
                bsp_api::control::PeerMemory::default()
            } else {
                bsp_api::control::PeerMemory {
                    rss_bytes: r.get::<_, i64>(10)?.max(0) as u64,
                    held_bytes: r.get::<_, i64>(11)?.max(0) as u64,
                    budget_bytes: r.get::<_, i64>(12)?.max(0) as u64,
                }
            };
            Ok(PeerInfo {
                id: r.get(0)?,
                name: r.get(1)?,
                addr: r.get(2)?,
                speed: r.get(3)?,
                idle: r.get(4)?,
                cores: r.get(5)?,
                state,
                lease_expires_at: r.get(7)?,
                processes: r.get(8)?,
                cluster: r.get(9)?,
                found_cluster: None,
                memory,
                links: Vec::new(),
                enrollment: r.get(13)?,
                disabled: r.get(14)?,
                owner: r.get(15)?,
                power: r.get(16)?,
                quarantined: r.get(17)?,
                delivered_power: None,
            })
        })?;
        Ok(rows.collect::<crate::sql::Result<_>>()?)
    }
}

impl Core {
    /// The `/metrics` gauges, as the database has them now.
    pub(crate) fn metrics_gauges(&self) -> Result<crate::metrics::Gauges, Error> {
        let count = |sql: &str| -> Result<u64, Error> {
            Ok(self.conn.query_row(sql, [], |r| r.get::<_, i64>(0))?.max(0) as u64)
        };
        let mut g = crate::metrics::Gauges {
            jobs_waiting: count("SELECT count(*) FROM jobs WHERE state = 'waiting'")?,
            jobs_active: count("SELECT count(*) FROM jobs WHERE state = 'active'")?,
            jobs_finished: count("SELECT count(*) FROM jobs WHERE state = 'finished'")?,
            processes: count(
                "SELECT count(*) FROM placements pl JOIN jobs j ON j.id = pl.job \
                 WHERE j.state = 'active'",
            )?,
            users: count("SELECT count(*) FROM users")?,
            programs: count("SELECT count(*) FROM programs")?,
            stored_output_bytes: count("SELECT coalesce(sum(output_bytes), 0) FROM jobs")?,
            ..Default::default()
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT state, draining, count(*), coalesce(sum(cores), 0), \
                 coalesce(sum(rss_bytes), 0), coalesce(sum(held_bytes), 0) \
             FROM peers GROUP BY state, draining",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, bool>(1)?,
                r.get::<_, i64>(2)?.max(0) as u64,
                r.get::<_, i64>(3)?.max(0) as u64,
                r.get::<_, i64>(4)?.max(0) as u64,
                r.get::<_, i64>(5)?.max(0) as u64,
            ))
        })?;
        for row in rows {
            let (state, draining, n, cores, rss, held) = row?;
            if state != "online" {
                g.peers_gone += n;
                continue;
            }
            if draining {
                g.peers_draining += n;
            } else {
                g.peers_online += n;
            }
            g.cores_online += cores;
            g.rss_bytes += rss;
            g.held_bytes += held;
        }
        Ok(g)
    }
}
