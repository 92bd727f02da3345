"""What the failed-login tests share: one ticket principal and the answers of the throttle."""

#: A policy with one ticket principal and no anonymous logins (write it to a file, pass --auth-policy).
POLICY = """\
anonymous = false
[roles.writer]
subscribe = [""]
publish = [""]
[[principals]]
authid = "alice"
role = "writer"
ticket = "the-real-ticket"
"""
#: ABORT reason of a source locked out after failed logins.
TOO_MANY = "pubsubclub.error.too_many_auth_failures"
#: ABORT reason of a wrong credential.
FAILED = "wamp.error.authentication_failed"
