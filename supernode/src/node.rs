//! The [`Supernode`]'s methods: opening its state, running work on its
//! core (exclusively or beside others), accounts, enrollments and
//! passwords, the shared database's changes and wake-ups, and its HTTP
//! router and server.

use super::*;

impl Supernode {
    /// Opens the supernode's state in `config.data_dir`: the SQLite database
    /// (write-ahead log, foreign keys on, migrations applied) and the JWT
    /// secret (generated with mode 0600 on first start). Peers and running
    /// jobs recorded there carry on.
    pub fn open(config: Config) -> anyhow::Result<Supernode> {
        use anyhow::Context;
        if !(config.overload_factor.is_finite() && config.overload_factor > 0.0) {
            anyhow::bail!(
                "the overload factor must be a positive number, not {}",
                config.overload_factor
            );
        }
        if !(config.power_hysteresis.is_finite() && config.power_hysteresis >= 0.0) {
            anyhow::bail!(
                "the power hysteresis must be a fraction of at least 0, not {}",
                config.power_hysteresis
            );
        }
        if config.lease_ttl < Duration::from_millis(30) {
            anyhow::bail!(
                "the lease TTL must be at least 30 ms, not {:?}",
                config.lease_ttl
            );
        }
        std::fs::create_dir_all(&config.data_dir).with_context(|| {
            format!(
                "cannot create the data directory {}",
                config.data_dir.display()
            )
        })?;
        let database = match &config.database {
            None => db::Database::Sqlite(config.data_dir.join("bspweb.sqlite3")),
            Some(url) => db::Database::Postgres(Box::new(
                sql::PgConfig::parse(url).map_err(anyhow::Error::msg)?,
            )),
        };
        tracing::info!(%database, "state stored in {database}");
        let lease_ttl = config.lease_ttl;
        let secret_file = config.data_dir.join("jwt-secret");
        let load = move || -> anyhow::Result<_> {
            let mut conn = db::open(&database)?;
            // Several supernodes on one database share their JWT secret.
            let secret = match database {
                db::Database::Sqlite(_) => auth::load_or_create_secret(&secret_file)?,
                db::Database::Postgres(_) => shared::secret(&mut conn)?,
            };
            let (core, live) = state::Core::load(conn, lease_ttl)?;
            let accounts = core.accounts()?;
            Ok((core, live, accounts, secret))
        };
        // The PostgreSQL client blocks on a runtime of its own, which
        // cannot start on a thread that drives a runtime already, so the
        // state loads on a thread of its own; later queries run on
        // blocking threads (`with_core`).
        let (core, live, accounts, secret) = std::thread::scope(|s| {
            s.spawn(load)
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })?;
        let instance = core.shared.as_ref().map_or(0, |s| s.instance);
        Ok(Supernode {
            inner: Arc::new(Inner {
                config,
                core: Mutex::new(core),
                live: Mutex::new(live),
                keys: auth::Keys::from_secret(&secret),
                sched_wake: Notify::new(),
                job_watch: Mutex::new(HashMap::new()),
                job_list: broadcast::channel(JOB_LIST_CAPACITY).0,
                shutdown: watch::channel(false).0,
                storage_trouble: Mutex::new(None),
                instance,
                metrics: metrics::Metrics::default(),
                accounts: Mutex::new(accounts),
                found_clusters: Mutex::new(Arc::new(BTreeMap::new())),
                renewals: Default::default(),
            }),
        })
    }

    /// Runs `f` on the core state on a blocking thread, then applies the
    /// effects it produced (still under the lock, so command order follows
    /// state order).
    pub(crate) async fn with_core<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut state::Core, &Inner, &mut Effects) -> Result<T, Error> + Send + 'static,
    {
        self.on_core(true, f).await
    }

    /// [`Supernode::with_core`] without the shared database's exclusive
    /// lock and resync: for what holds its own (shared) lock, the plain
    /// renewal (`state/plain_renewal.rs`).
    pub(crate) async fn with_core_plain<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut state::Core, &Inner, &mut Effects) -> Result<T, Error> + Send + 'static,
    {
        self.on_core(false, f).await
    }

    /// [`Supernode::with_core`] (`exclusive`) or
    /// [`Supernode::with_core_plain`].
    async fn on_core<T, F>(&self, exclusive: bool, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut state::Core, &Inner, &mut Effects) -> Result<T, Error> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut core = inner.lock_core();
            // With several supernodes on one database: their lock, and what
            // the others changed (`shared`).
            if exclusive && let Err(e) = shared::enter(&mut core, &inner) {
                if let Error::Database(d) = &e
                    && error::is_storage_error(d)
                {
                    inner.storage_failed(d);
                }
                return Err(e);
            }
            let mut fx = Effects::default();
            // A panic must not leave the shared lock held: every other
            // supernode would wait for it.
            let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                f(&mut core, &inner, &mut fx)
            })) {
                Ok(out) => out,
                Err(panic) => {
                    if exclusive {
                        shared::leave(&mut core, &inner, None);
                    }
                    std::panic::resume_unwind(panic);
                }
            };
            match &out {
                Ok(_) => {}
                // The transaction rolled back; the in-memory placement tables
                // may have moved ahead of it, so rebuild them (still under
                // the shared lock). What runs without it changes none.
                Err(Error::Database(e)) => {
                    if error::is_storage_error(e) {
                        inner.storage_failed(e);
                    } else if exclusive {
                        tracing::error!(error = %e, "database operation failed; rebuilding the placement tables");
                    }
                    if exclusive && let Err(e) = core.rebuild_placement() {
                        tracing::error!(error = %e, "cannot rebuild the placement tables");
                    }
                }
                Err(_) => {}
            }
            if exclusive {
                shared::leave(&mut core, &inner, out.is_ok().then_some(&fx));
            }
            if out.is_ok() {
                inner.apply(fx);
            }
            out
        })
        .await?
    }

    /// Creates an account with the supernode's default quotas. Fails with
    /// [`Error::Conflict`] if the name is taken and [`Error::BadRequest`]
    /// for a bad name or password.
    pub async fn create_user(
        &self,
        name: &str,
        password: &str,
        role: Role,
    ) -> Result<UserInfo, Error> {
        self.create_user_with(name, password, role, QuotaChange::default())
            .await
    }

    /// A new enrollment token of the account `owner` (`bspweb up` enrolls
    /// its local peers with one). Fails with [`Error::NotFound`] if there is
    /// no such account.
    pub async fn create_enrollment(
        &self,
        owner: &str,
        name: &str,
    ) -> Result<bsp_api::rest::NewEnrollment, Error> {
        let (owner, name) = (owner.to_string(), name.to_string());
        self.with_core(move |core, _, _| {
            let id = core.user_id(&owner)?;
            core.create_enrollment(id, &name, now_ms())
        })
        .await
    }

    /// Whether a peer logging in with `token` would be admitted (under a
    /// name that is not disabled).
    pub async fn admits(&self, token: &bsp_api::control::EnrollmentToken) -> Result<bool, Error> {
        let token = token.clone();
        self.with_core(move |core, _, _| core.admits(&token)).await
    }

    /// [`Supernode::create_user`] with quotas of its own.
    pub async fn create_user_with(
        &self,
        name: &str,
        password: &str,
        role: Role,
        quotas: QuotaChange,
    ) -> Result<UserInfo, Error> {
        state::check_user_name(name)?;
        state::check_password(password)?;
        state::check_quotas(&quotas)?;
        let hash = hash_password(password).await?;
        let name = name.to_string();
        self.with_core(move |core, inner, _| core.create_user(inner, &name, &hash, role, &quotas))
            .await
    }

    /// Sets the password of the account `name`; its earlier tokens stop
    /// working.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<UserInfo, Error> {
        Ok(self.set_password_generation(name, password).await?.0)
    }

    /// [`Supernode::set_password`], with the account's new token generation.
    pub(crate) async fn set_password_generation(
        &self,
        name: &str,
        password: &str,
    ) -> Result<(UserInfo, i64), Error> {
        state::check_password(password)?;
        let hash = hash_password(password).await?;
        let name = name.to_string();
        self.with_core(move |core, inner, _| core.set_password(inner, &name, &hash))
            .await
    }

    /// The user with this name and password, or `None` if there is no such
    /// user or the password is wrong.
    pub async fn check_password(
        &self,
        name: &str,
        password: &str,
    ) -> Result<Option<UserInfo>, Error> {
        Ok(self.check_login(name, password).await?.map(|(u, _)| u))
    }

    /// [`Supernode::check_password`], with the token generation read in the
    /// same row as the password hash: a login that races a password change
    /// gets a token of the generation its password belonged to.
    pub(crate) async fn check_login(
        &self,
        name: &str,
        password: &str,
    ) -> Result<Option<(UserInfo, i64)>, Error> {
        let lookup = name.to_string();
        let found = self
            .with_core(move |core, inner, _| core.user_with_hash(inner, &lookup))
            .await?;
        let Some((user, hash, generation)) = found else {
            // Spend the same effort as for a real user, so timing does not
            // reveal which names exist.
            let password = password.to_string();
            tokio::task::spawn_blocking(move || {
                auth::verify_password(&password, DUMMY_HASH.as_str())
            })
            .await?;
            return Ok(None);
        };
        let password = password.to_string();
        let ok =
            tokio::task::spawn_blocking(move || auth::verify_password(&password, &hash)).await?;
        Ok(ok.then_some((user, generation)))
    }

    /// Registers a bundled example program under `name`, visible to every
    /// user. Validates the module; registering the same name again replaces
    /// the module and description (so upgrades ship new builtins).
    pub async fn register_builtin(
        &self,
        name: &str,
        description: &str,
        wasm: &[u8],
    ) -> Result<ProgramInfo, Error> {
        state::check_program_name(name)?;
        let wasm = wasm.to_vec();
        let (hash, wasm) =
            tokio::task::spawn_blocking(move || state::validate_module(&wasm).map(|h| (h, wasm)))
                .await??;
        let name = name.to_string();
        let description = description.to_string();
        self.with_core(move |core, inner, _| {
            core.store_program(
                &inner.config,
                None,
                Some(&name),
                Some(&description),
                &hash,
                &wasm,
            )
        })
        .await
    }

    /// The notification listener's settings, when the database is shared
    /// (PostgreSQL).
    fn lock_shared_config(&self) -> Option<tokio_postgres::Config> {
        let core = self.inner.lock_core();
        core.conn.postgres_conn().map(|c| c.config().tokio())
    }

    /// With a shared database, reads what other supernodes changed since
    /// this one last looked; `false` (nothing done) with SQLite.
    pub(crate) async fn refresh_shared(&self) -> bool {
        self.read_shared_changes().await.is_some()
    }

    /// With a shared database, reads what other supernodes changed since
    /// this one last looked: `Some(true)` if anything had changed, `None`
    /// with SQLite (or when the database cannot be reached).
    pub(crate) async fn read_shared_changes(&self) -> Option<bool> {
        if self.inner.instance == 0 {
            return None;
        }
        let read = self
            .with_core(|core, _, _| Ok(core.shared.as_ref().is_some_and(|s| s.resynced)))
            .await;
        match read {
            Ok(changed) => Some(changed),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read what other supernodes changed");
                None
            }
        }
    }

    /// With a shared database, reads `peer`'s lease from it (it may have
    /// logged in or renewed at another supernode); `false` with SQLite.
    pub(crate) async fn refresh_peer(&self, peer: bsp_api::PeerId) -> bool {
        if self.inner.instance == 0 {
            return false;
        }
        self.with_core(move |core, inner, _| core.refresh_lease(inner, peer))
            .await
            .is_ok()
    }

    /// This process's instance id among the supernodes of its database.
    pub(crate) fn instance(&self) -> u64 {
        self.inner.instance
    }

    /// Another supernode changed the shared database: read it again (waking
    /// the long polls of peers with new commands), then wake the event
    /// streams, job lists and scheduler it names.
    pub(crate) async fn wake_from_elsewhere(&self, wake: shared::Wake) {
        self.refresh_shared().await;
        let inner = &self.inner;
        {
            let mut watch = inner.job_watch.lock().unwrap_or_else(|e| e.into_inner());
            watch.retain(|_, tx| tx.receiver_count() > 0);
            for (job, tx) in watch.iter() {
                if wake.all || wake.jobs.contains(job) {
                    tx.send_replace(());
                }
            }
        }
        for change in wake.job_list {
            let _ = inner.job_list.send(change);
        }
        if wake.all {
            // Every follower of a job list re-reads it.
            let _ = inner.job_list.send((sse::EVERY_OWNER, 0));
        }
        if wake.scheduler || wake.all {
            inner.sched_wake.notify_one();
        }
    }

    /// The HTTP routes: the REST API, the peer control plane and the web UI.
    /// The scheduler and the lease sweeper only run under [`Supernode::serve`].
    pub fn router(&self) -> axum::Router {
        http::router(self.clone())
    }

    /// Serves HTTP on `listener` and runs the scheduler and the lease sweeper
    /// until `shutdown` completes; then ends open event streams and long
    /// polls, and returns once the connections are closed.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let addr = listener.local_addr()?;
        if self.inner.config.tls.is_none() && !addr.ip().is_loopback() {
            anyhow::bail!(
                "plain HTTP is served on loopback addresses only, not on {addr}: passwords and tokens would cross the network in clear text; serve HTTPS (`bspweb supernode` does so by itself on such an address)"
            );
        }
        match &self.inner.config.public_url {
            Some(url) => tracing::info!(%addr, public_url = %url, "supernode listening"),
            None => tracing::info!(%addr, "supernode listening"),
        }
        // Peers could not renew until now.
        if let Err(e) = self
            .with_core(|core, inner, _| core.extend_leases_at_start(inner, now_ms()))
            .await
        {
            tracing::error!(error = %e, "cannot extend the peers' leases at start");
        }
        suspect::check_at_start(&self).await;
        let scheduler = tokio::spawn(state::scheduler_task(self.clone()));
        let sweeper = tokio::spawn(state::lease_task(self.clone()));
        let clustering = tokio::spawn(clusters::cluster_task(self.clone()));
        let listener_task = self
            .lock_shared_config()
            .map(|config| tokio::spawn(shared::listen_task(self.clone(), config)));
        let inner = self.inner.clone();
        tokio::spawn(async move {
            shutdown.await;
            inner.shutdown.send_replace(true);
        });
        let app = self.router();
        let limits = self.inner.config.http;
        let stop = self.inner.shutdown_signal();
        let tls = self.inner.config.tls.as_ref().map(ServerTls::acceptor);
        let result = listen::serve(listener, app, limits, stop, tls).await;
        scheduler.abort();
        sweeper.abort();
        clustering.abort();
        if let Some(task) = listener_task {
            task.abort();
        }
        result?;
        tracing::info!("supernode stopped");
        Ok(())
    }
}
