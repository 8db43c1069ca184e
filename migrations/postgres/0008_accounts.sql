-- bspweb supernode schema, version 8: accounts (issue 19).
-- `role` replaces the `admin` flag: `admin` manages accounts, `user` runs
-- jobs, `volunteer` donates computers and runs no jobs.
ALTER TABLE users ADD COLUMN role TEXT NOT NULL DEFAULT 'user'
    CHECK (role IN ('admin', 'user', 'volunteer'));
UPDATE users SET role = 'admin' WHERE admin = 1;
ALTER TABLE users DROP COLUMN admin;
-- A disabled account cannot log in, and its tokens are refused.
ALTER TABLE users ADD COLUMN disabled BIGINT NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1));
-- A user token carries the generation it was issued in; changing the
-- password or disabling the account increments it, ending every earlier login.
ALTER TABLE users ADD COLUMN token_generation BIGINT NOT NULL DEFAULT 0;
-- Quotas; NULL: the supernode's default, 0: no limit. Processes of the
-- user's active jobs (a job that would exceed it waits), programs stored,
-- output stored in MiB.
ALTER TABLE users ADD COLUMN max_processes BIGINT CHECK (max_processes >= 0);
ALTER TABLE users ADD COLUMN max_programs BIGINT CHECK (max_programs >= 0);
ALTER TABLE users ADD COLUMN max_output_mib BIGINT CHECK (max_output_mib >= 0);
