// pubsubclub chat page: one WAMP session to ws(s)://<this host:port>/ws,
// subscribed to TOPIC; each message is published as a single positional arg
// {"nick": ..., "text": ...} with exclude_me: false, so the sender sees it too.
(function () {
  "use strict";

  var TOPIC = "pubsubclub.demo.chat";
  var params = new URLSearchParams(window.location.search);
  var realm = params.get("realm") || "realm1";
  // ?url= overrides the WebSocket URL (for testing); default is same host:port.
  var url = params.get("url") ||
    ((window.location.protocol === "https:" ? "wss://" : "ws://") + window.location.host + "/ws");

  var statusEl = document.getElementById("status");
  var detailEl = document.getElementById("detail");
  var messagesEl = document.getElementById("messages");
  var nickEl = document.getElementById("nick");
  var textEl = document.getElementById("text");
  var sendEl = document.getElementById("send");
  var formEl = document.getElementById("form");

  var session = null;

  function setStatus(state, detail) {
    statusEl.textContent = state;           // exactly "connecting" / "connected" / "disconnected"
    statusEl.className = state;
    detailEl.textContent = detail || "";
    sendEl.disabled = state !== "connected";
  }

  function addMessage(nick, text) {
    var li = document.createElement("li");
    var n = document.createElement("span");
    n.className = "nick";
    n.textContent = nick;
    li.appendChild(n);
    li.appendChild(document.createTextNode(": " + text));   // li text is "<nick>: <text>"
    var atBottom = messagesEl.scrollHeight - messagesEl.scrollTop - messagesEl.clientHeight < 40;
    messagesEl.appendChild(li);
    if (atBottom) { messagesEl.scrollTop = messagesEl.scrollHeight; }
  }

  function onEvent(args, kwargs) {
    var m = (args && args.length) ? args[0] : kwargs;
    if (m && typeof m === "object" && "text" in m) {
      addMessage(String(m.nick || "anonymous"), String(m.text));
    } else if (typeof m === "string") {
      // Text from other front-ends (SysV "[chat] [nick]: text", TEP, stream), shown as it is.
      addMessage("·", m);
    } else {
      addMessage("?", JSON.stringify({ args: args, kwargs: kwargs }));
    }
  }

  function send() {
    var text = textEl.value.trim();
    if (!session || !session.isOpen || !text) { return; }
    var nick = nickEl.value.trim() || "anonymous";
    session.publish(TOPIC, [{ nick: nick, text: text }], {},
                    { exclude_me: false, acknowledge: true })
      .then(function () { detailEl.textContent = ""; },
            function (err) { detailEl.textContent = "publish failed: " + (err && err.error || err); });
    textEl.value = "";
    textEl.focus();
  }

  formEl.addEventListener("submit", function (ev) { ev.preventDefault(); send(); });  // button click and Enter

  if (typeof autobahn === "undefined") {
    setStatus("disconnected", "autobahn.min.js failed to load");
    return;
  }

  var connection = new autobahn.Connection({ url: url, realm: realm, max_retry_delay: 5 });

  connection.onopen = function (s) {
    session = s;
    s.subscribe(TOPIC, onEvent).then(
      function () { setStatus("connected", "realm " + realm + " · " + url); },
      function (err) { setStatus("disconnected", "subscribe failed: " + (err && err.error || err)); });
  };

  connection.onclose = function (reason, details) {
    session = null;
    var willRetry = details && details.will_retry;
    setStatus(willRetry ? "connecting" : "disconnected",
              reason + (willRetry ? " · retrying in " + Math.round(details.retry_delay) + " s" : ""));
    return false;   // let autobahn keep retrying
  };

  setStatus("connecting", url);
  connection.open();
}());
