-- bspweb supernode schema, version 4: the network cluster a peer says it is
-- in (`bspweb peer --cluster`), handed to the job's peers so they can pick
-- broadcast schedules and Robber's collectives. NULL: not configured.
ALTER TABLE peers ADD COLUMN cluster TEXT;
