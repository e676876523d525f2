-- Recordings of commands as well as terminal sessions: `exec` calls and shell-session
-- commands, sent whole by the worker once each ended.
ALTER TABLE recordings
    ADD COLUMN kind text NOT NULL DEFAULT 'terminal' CHECK (kind IN ('terminal', 'exec', 'shell')),
    ADD COLUMN shell_session text;
