"""What the suites share: `api` (calls of the public API, sign-ups), `gateways` (real
gateways and workers as processes), `standin` (the model providers' stand-in), `upstream`
(an HTTP/HTTPS upstream in a network namespace, for egress), `certs` (a CA and certificates
made with openssl)."""
