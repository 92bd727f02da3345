"""``pubsubclub bench``: the scenarios (wamp, link, peers, stream, idle, fanout) and the processes they measure."""
