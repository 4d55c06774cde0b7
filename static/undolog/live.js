/* undolog dashboard: what every page shares.
 *
 * - One websocket per page to /ws/dashboard/, joined by the server to the org's group.
 *   Pages subscribe with UL.on(kind, fn). When it drops, the page says so, reconnects with
 *   backoff, and every UL.onConnect handler runs again so the page re-fetches what it missed
 *   (the channel layer may drop messages: the API, not the socket, is the truth).
 * - UL.api(method, path, body): the REST API with the session cookie and the CSRF token;
 *   rejects with the API's own error message.
 * - Countdowns, the nav badge and tab title, the incident banner, a confirm dialog, a beep.
 * Plain JavaScript, no build step, no third-party code.
 */
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("dashboard-config").textContent);
  var csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");
  var listeners = {};
  var connectHandlers = [];
  var socket = null;
  var attempts = 0;
  var retryTimer = null;
  var pingTimer = null;
  var pongDeadline = null;
  var retryAt = 0;
  var baseTitle = document.title.replace(/^\(\d+\)\s*/, "");
  var statusEl = document.getElementById("live-status");
  var bannerEl = document.getElementById("connection-banner");
  var detailEl = document.getElementById("connection-detail");

  var UL = {config: config};
  window.UL = UL;

  UL.on = function (kind, fn) {
    (listeners[kind] = listeners[kind] || []).push(fn);
  };

  UL.onConnect = function (fn) {
    connectHandlers.push(fn);
  };

  /* ------------------------------------------------------------ the nav */

  /* On a phone the nav is one row that scrolls sideways: the current page's link is brought
   * into view (centred where it can be), or Settings and Audit sit off-screen. */
  (function () {
    var current = document.querySelector("header nav a[aria-current=page]");
    var nav = current && current.parentElement;
    if (!nav || nav.scrollWidth <= nav.clientWidth) return;
    var navBox = nav.getBoundingClientRect(), box = current.getBoundingClientRect();
    nav.scrollLeft += box.left - navBox.left - (navBox.width - box.width) / 2;
  })();

  /* ------------------------------------------------------------ websocket */

  function setStatus(state, text) {
    statusEl.dataset.state = state;
    statusEl.textContent = text;
    document.body.dataset.live = state;
  }

  function connect() {
    clearTimeout(retryTimer);
    retryTimer = null;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    setStatus("connecting", attempts ? "reconnecting…" : "connecting…");
    try {
      socket = new WebSocket(scheme + location.host + config.ws);
    } catch (err) {
      scheduleReconnect();
      return;
    }
    var opened = false;
    socket.onopen = function () {
      opened = true;
    };
    socket.onmessage = function (event) {
      var message;
      try {
        message = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      if (message.type === "hello") {
        var reconnected = attempts > 0;
        attempts = 0;
        setStatus("live", "live");
        bannerEl.hidden = true;
        startPings();
        connectHandlers.forEach(function (fn) { safely(fn, reconnected); });
        return;
      }
      if (message.type === "pong") {
        pongDeadline = null;
        return;
      }
      (listeners[message.type] || []).forEach(function (fn) { safely(fn, message.payload || {}, message); });
      (listeners["*"] || []).forEach(function (fn) { safely(fn, message.payload || {}, message); });
    };
    socket.onclose = function (event) {
      stopPings();
      socket = null;
      if (event.code === 4401 || event.code === 4403) {
        return refused(event.code);
      }
      if (!opened && attempts > 2) {
        // The handshake keeps failing: maybe the session expired. Ask the API who we are.
        whoAmI();
      }
      scheduleReconnect();
    };
  }

  function safely(fn) {
    try {
      fn.apply(null, Array.prototype.slice.call(arguments, 1));
    } catch (err) {
      if (window.console) console.error(err);
    }
  }

  function scheduleReconnect() {
    attempts += 1;
    // Exponential backoff with jitter: 0.5 s, 1 s, 2 s, … at most 15 s.
    var delay = Math.min(15000, 500 * Math.pow(2, attempts - 1));
    delay = Math.round(delay / 2 + Math.random() * delay / 2);
    retryAt = Date.now() + delay;
    setStatus("down", "disconnected");
    bannerEl.hidden = false;
    tickBanner();
    retryTimer = setTimeout(connect, delay);
  }

  function tickBanner() {
    if (!retryTimer && socket) return;
    var seconds = Math.max(0, Math.ceil((retryAt - Date.now()) / 1000));
    detailEl.textContent = seconds > 0
      ? "Reconnecting in " + seconds + " s; what you see may be out of date."
      : "Reconnecting…";
  }

  function refused(code) {
    setStatus("down", "refused");
    bannerEl.hidden = false;
    detailEl.textContent = code === 4401
      ? "You are logged out. Log in again to see live updates."
      : "You are no longer a member of this organization.";
  }

  function whoAmI() {
    fetch("/api/v1/approvals?state=pending&limit=1", {credentials: "same-origin", headers: orgHeaders()})
      .then(function (response) {
        if (response.status === 401 || response.status === 403) {
          clearTimeout(retryTimer);
          retryTimer = null;
          refused(response.status === 401 ? 4401 : 4403);
        }
      })
      .catch(function () { /* the server is down; keep retrying */ });
  }

  function startPings() {
    stopPings();
    pingTimer = setInterval(function () {
      if (!socket || socket.readyState !== WebSocket.OPEN) return;
      if (pongDeadline && Date.now() > pongDeadline) {
        // No answer to the last ping: the connection died without a close frame.
        socket.close();
        return;
      }
      socket.send(JSON.stringify({type: "ping"}));
      pongDeadline = Date.now() + 10000;
    }, 20000);
  }

  function stopPings() {
    clearInterval(pingTimer);
    pingTimer = null;
    pongDeadline = null;
  }

  UL.reconnectNow = function () {
    if (socket) return;
    connect();
  };

  /* For tests and for people: drop the socket as a network failure would. */
  UL.dropConnection = function () {
    if (socket) socket.close(4000, "dropped by the page");
  };

  document.getElementById("reconnect-now").addEventListener("click", UL.reconnectNow);

  /* ------------------------------------------------------------ the API */

  function orgHeaders() {
    return {"X-Undolog-Org": config.org};
  }

  UL.api = function (method, path, body) {
    var headers = orgHeaders();
    headers["Accept"] = "application/json";
    if (method !== "GET") {
      headers["X-CSRFToken"] = csrf;
      headers["Content-Type"] = "application/json";
    }
    return fetch(path, {
      method: method, credentials: "same-origin", headers: headers,
      body: body === undefined ? undefined : JSON.stringify(body)
    }).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : null; } catch (err) { data = null; }
        if (!response.ok) {
          var message = (data && data.message) || ("The server answered " + response.status + ".");
          var error = new Error(message);
          error.status = response.status;
          error.body = data;
          throw error;
        }
        return data;
      });
    }, function () {
      throw new Error("The server could not be reached; try again.");
    });
  };

  /* Run an action: disable the button meanwhile, show the API's message if it fails. */
  UL.act = function (button, promiseFn, success) {
    if (button) button.disabled = true;
    return promiseFn().then(function (data) {
      if (success) UL.flash(success, "ok");
      return data;
    }, function (err) {
      UL.flash(err.message, "error");
      throw err;
    }).finally(function () {
      if (button) button.disabled = false;
    });
  };

  /* Follow a walk under way (a fleet rollback, a rewind): GET `path` every second and hand each
   * answer to `step`, while it returns true; `step(null)` when a read fails (then it stops). */
  UL.follow = function (path, step) {
    (function tick() {
      UL.api("GET", path).then(function (answer) {
        if (step(answer)) setTimeout(tick, 1000);
      }, function () { step(null); });
    })();
  };

  var flashTimer = null;
  UL.flash = function (text, kind) {
    var el = document.getElementById("flash");
    el.textContent = text;
    el.className = "flash show " + (kind || "info");
    clearTimeout(flashTimer);
    flashTimer = setTimeout(function () { el.className = "flash"; }, kind === "error" ? 12000 : 4000);
  };

  /* Swap a server-rendered fragment (`?part=live`) into `el`; one request at a time. */
  UL.refresher = function (el, url) {
    var running = false, again = false;
    function run() {
      if (running) { again = true; return; }
      running = true;
      fetch(url || (location.pathname + "?part=live"), {credentials: "same-origin"})
        .then(function (response) {
          if (!response.ok) throw new Error("refresh failed: " + response.status);
          return response.text();
        })
        .then(function (html) {
          el.innerHTML = html;
          UL.tick();
          el.dispatchEvent(new CustomEvent("ul:refreshed", {bubbles: true}));
        })
        .catch(function () { /* the next event or reconnect tries again */ })
        .finally(function () {
          running = false;
          if (again) { again = false; setTimeout(run, 100); }
        });
    }
    return run;
  };

  /* ------------------------------------------------------------ confirm dialog */

  /* opts: {title, body (Node or text), confirm, input: {label, required}}; resolves with the
   * input's value (or true), or null when cancelled. */
  UL.confirm = function (opts) {
    var dialog = document.getElementById("confirm-dialog");
    var input = document.getElementById("confirm-input");
    var inputLabel = document.getElementById("confirm-input-label");
    var errorEl = document.getElementById("confirm-error");
    var body = document.getElementById("confirm-body");
    document.getElementById("confirm-title").textContent = opts.title;
    body.textContent = "";
    if (typeof opts.body === "string") {
      var p = document.createElement("p");
      p.textContent = opts.body;
      body.appendChild(p);
    } else if (opts.body) {
      body.appendChild(opts.body);
    }
    document.getElementById("confirm-ok").textContent = opts.confirm || "Confirm";
    inputLabel.hidden = !opts.input;
    input.value = "";
    errorEl.hidden = true;
    if (opts.input) document.getElementById("confirm-input-name").textContent = opts.input.label;
    return new Promise(function (resolve) {
      var ok = document.getElementById("confirm-ok");
      var cancel = document.getElementById("confirm-cancel");
      function finish(value) {
        ok.removeEventListener("click", onOk);
        cancel.removeEventListener("click", onCancel);
        dialog.removeEventListener("cancel", onCancel);
        if (dialog.open) dialog.close();
        resolve(value);
      }
      function onOk(event) {
        event.preventDefault();
        if (opts.input) {
          var value = input.value.trim();
          if (opts.input.required && !value) {
            errorEl.textContent = opts.input.label + " is required.";
            errorEl.hidden = false;
            input.focus();
            return;
          }
          finish(value);
        } else {
          finish(true);
        }
      }
      function onCancel(event) {
        if (event) event.preventDefault();
        finish(null);
      }
      ok.addEventListener("click", onOk);
      cancel.addEventListener("click", onCancel);
      dialog.addEventListener("cancel", onCancel);
      dialog.showModal();
      (opts.input ? input : cancel).focus();
    });
  };

  /* ------------------------------------------------------------ countdowns and counts */

  function formatLeft(ms) {
    var s = Math.round(Math.abs(ms) / 1000);
    var text;
    if (s < 60) text = s + " s";
    else if (s < 3600) text = Math.floor(s / 60) + " min " + (s % 60 < 10 ? "0" : "") + (s % 60) + " s";
    else if (s < 86400) text = Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    else text = Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
    return ms < 0 ? "overdue " + text : text;
  }
  UL.formatLeft = formatLeft;

  /* A moment in the org's time zone, with the zone named ("2026-12-04 18:30 UTC", "… GMT+9"), in
   * the server's "Y-m-d H:i" order: the browser's locale and zone differed from every other time. */
  UL.formatTime = function (iso) {
    var zone = config.time_zone || "UTC";
    var parts = {};
    new Intl.DateTimeFormat("en-CA", {timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit",
                                      hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZoneName: "short"})
      .formatToParts(new Date(iso)).forEach(function (part) { parts[part.type] = part.value; });
    return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" + parts.minute + " " + parts.timeZoneName;
  };

  UL.tick = function () {
    var now = Date.now();
    document.querySelectorAll("time.countdown").forEach(function (el) {
      var deadline = Date.parse(el.getAttribute("datetime"));
      if (isNaN(deadline)) return;
      var left = deadline - now;
      el.textContent = formatLeft(left);
      el.classList.toggle("urgent", left >= 0 && left < 120000);
      el.classList.toggle("overdue", left < 0);
    });
  };
  setInterval(UL.tick, 1000);
  UL.tick();

  UL.setPending = function (count) {
    var badge = document.getElementById("nav-pending");
    badge.textContent = count;
    badge.hidden = !count;
    var tab = document.querySelector("#tab-pending .count");  // the queue's Pending tab says the same
    if (tab) tab.textContent = count;
    document.title = (count ? "(" + count + ") " : "") + baseTitle;
  };
  var initialBadge = document.getElementById("nav-pending");
  UL.setPending(parseInt(initialBadge.textContent, 10) || 0);

  /* Every page keeps the nav count live; the queue page manages its own list. */
  UL.on("approval.requested", function () { bumpPending(1); });
  UL.on("approval.decided", function () { bumpPending(-1); });
  UL.on("approval.expired", function () { bumpPending(-1); });
  function bumpPending(delta) {
    if (document.body.dataset.page === "queue" && UL.queueHasAll) return;
    var badge = document.getElementById("nav-pending");
    UL.setPending(Math.max(0, (parseInt(badge.textContent, 10) || 0) + delta));
  }
  UL.onConnect(function (reconnected) {
    if (!reconnected || (document.body.dataset.page === "queue" && UL.queueHasAll)) return;
    UL.api("GET", "/api/v1/approvals/stats").then(function (stats) {
      if (stats && typeof stats.pending === "number") UL.setPending(stats.pending);
    }, function () {});
  });

  /* The compensation-failures badge follows undo entries moving into and out of
   * compensation_failed (a failure, a retry, a resolution), as session.updated reports them. */
  UL.on("session.updated", function (payload) {
    var delta = 0;
    (payload.changes || []).forEach(function (change) {
      if (change.what !== "undo_entry") return;
      if (change.to === "compensation_failed") delta += 1;
      if (change.from === "compensation_failed") delta -= 1;
    });
    if (!delta) return;
    var badge = document.getElementById("nav-failures");
    var count = Math.max(0, (parseInt(badge.textContent, 10) || 0) + delta);
    badge.textContent = count;
    badge.hidden = count === 0;
  });

  /* ------------------------------------------------------------ incident banner */

  UL.on("incident.changed", function (payload) {
    var data = payload.data || {};
    var banner = document.getElementById("incident-banner");
    banner.hidden = !data.on;
    document.getElementById("incident-by").textContent = data.on && data.by ? " (turned on by " + data.by + ")" : "";
  });

  /* ------------------------------------------------------------ risk tags and sound */

  UL.riskClass = function (tag) {
    var lowered = String(tag).toLowerCase();
    for (var i = 0; i < config.risk_classes.length; i++) {
      var words = config.risk_classes[i][1];
      for (var j = 0; j < words.length; j++) {
        if (lowered.indexOf(words[j]) !== -1) return config.risk_classes[i][0];
      }
    }
    return "risk-other";
  };

  UL.beep = function () {
    try {
      var Context = window.AudioContext || window.webkitAudioContext;
      if (!Context) return;
      var ctx = UL._audio || (UL._audio = new Context());
      var osc = ctx.createOscillator(), gain = ctx.createGain();
      osc.frequency.value = 880;
      gain.gain.setValueAtTime(0.08, ctx.currentTime);
      gain.gain.exponentialRampToValueAtTime(0.0001, ctx.currentTime + 0.25);
      osc.connect(gain).connect(ctx.destination);
      osc.start();
      osc.stop(ctx.currentTime + 0.25);
    } catch (err) { /* no sound is fine */ }
  };

  connect();
})();
