-- Audit events raised by workers (egress refusals, placeholders stopped) carry a key in
-- `details`; a resent report adds nothing.
CREATE UNIQUE INDEX audit_events_node_key ON audit_events ((details->>'event_key'))
    WHERE details ? 'event_key';
