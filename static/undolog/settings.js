/* Org settings and webhooks (admins). */
(function () {
  "use strict";
  var UL = window.UL;
  var form = document.getElementById("settings-form");
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var body = {
      // amount × unit (seconds per unit): the API keeps seconds.
      approval_timeout_s: parseInt(form.approval_timeout_amount.value, 10) * parseInt(form.approval_timeout_unit.value, 10),
      auto_approve_on_timeout: form.auto_approve_on_timeout.checked,
      context_window: parseInt(form.context_window.value, 10),
      run_idle_timeout_s: parseInt(form.run_idle_timeout_s.value, 10),
      email_notifications: form.email_notifications.checked,
      time_zone: form.time_zone.value
    };
    UL.act(form.querySelector("button[type=submit]"), function () {
      return UL.api("PATCH", "/api/v1/org/settings", body);
    }, "Settings saved.").catch(function () {});
  });

  /* Slack: the secrets are write-only; an empty field leaves the stored one alone. */
  var slackForm = document.getElementById("slack-form");
  if (slackForm) {
    slackForm.addEventListener("submit", function (event) {
      event.preventDefault();
      var body = {channel: slackForm.channel.value.trim()};
      ["bot_token", "signing_secret"].forEach(function (name) {
        var value = slackForm[name].value.trim();
        if (value) body[name] = value;
      });
      UL.act(slackForm.querySelector("button[type=submit]"), function () {
        return UL.api("PUT", "/api/v1/org/slack", body);
      }, "Slack saved.").then(function (data) {
        slackForm.bot_token.value = slackForm.signing_secret.value = "";
        document.getElementById("slack-status").textContent = "Connected to " + data.channel + " (bot token " +
          data.bot_token_hint + "). Request URL: " + data.interactions_url;
      }, function () {});
    });
    var disconnect = document.getElementById("slack-disconnect");
    if (disconnect) {
      disconnect.addEventListener("click", function () {
        UL.act(disconnect, function () { return UL.api("DELETE", "/api/v1/org/slack"); }, "Slack disconnected.")
          .then(function () { location.reload(); }, function () {});
      });
    }
  }

  /* The org's signing secret (admins): masked until shown; a rotation keeps the old one signing
     for the chosen overlap. */
  var secret = document.getElementById("org-webhook-secret");
  if (secret) {
    var reveal = document.getElementById("reveal-secret");
    var showSecret = function (shown) {
      var value = secret.dataset.secret;
      secret.textContent = shown ? value : "whsec_…" + value.slice(-4);
      reveal.textContent = shown ? "Hide" : "Show";
      reveal.setAttribute("aria-pressed", shown ? "true" : "false");
    };
    reveal.addEventListener("click", function () { showSecret(reveal.getAttribute("aria-pressed") !== "true"); });
    var rotateForm = document.getElementById("rotate-secret-form");
    rotateForm.addEventListener("submit", function (event) {
      event.preventDefault();
      var overlap = parseInt(rotateForm.overlap_s.value, 10);
      var body = overlap ? "The old secret keeps signing beside the new one for the overlap; update your receivers before it ends."
                         : "The old secret stops signing now: receivers that still hold it will refuse undolog's webhooks.";
      // Two secrets sign at most: a rotation inside the last one's overlap cuts that overlap short.
      var earlier = document.getElementById("secret-overlap");
      if (!earlier.hidden) {
        body += " The secret before it, still signing from the last rotation, stops signing now: " +
          "receivers that have not moved off it yet will refuse undolog's webhooks.";
      }
      UL.confirm({title: "Rotate the webhook signing secret?", body: body,
                  confirm: "Rotate"}).then(function (ok) {
        if (!ok) return;
        UL.act(rotateForm.querySelector("button[type=submit]"), function () {
          return UL.api("POST", "/api/v1/org/webhook-secret/rotate", {overlap_s: overlap});
        }, "Secret rotated: the new one is shown.").then(function (data) {
          secret.dataset.secret = data.secret;
          showSecret(true);
          var note = document.getElementById("secret-overlap");
          note.hidden = data.signing_secrets < 2;
          if (data.previous_secret_expires_at) {
            note.textContent = "The previous secret also signs until " +
              UL.formatTime(data.previous_secret_expires_at) + ".";
          }
        }, function () {});
      });
    });
  }

  var hookForm = document.getElementById("webhook-form");
  if (!hookForm) return;
  hookForm.addEventListener("submit", function (event) {
    event.preventDefault();
    var kinds = Array.prototype.map.call(hookForm.querySelectorAll("input[name=event_types]:checked"),
                                         function (box) { return box.value; });
    UL.act(hookForm.querySelector("button[type=submit]"), function () {
      return UL.api("POST", "/api/v1/webhooks", {url: hookForm.url.value.trim(), event_types: kinds,
                                                  slack: hookForm.slack.checked});
    }, "Webhook added.").then(function (hook) {
      var note = document.getElementById("webhook-secret");
      note.hidden = false;
      note.textContent = "Signing secret of the new webhook (shown once): " + hook.secret;
      hookForm.reset();
      addRow(hook);
    }, function () {});
  });

  function addRow(hook) {
    var tbody = document.getElementById("webhook-rows");
    var empty = tbody.querySelector(".empty-row");
    if (empty) empty.remove();
    var row = document.createElement("tr");
    row.dataset.webhook = hook.id;
    [hook.url, (hook.event_types || []).join(", ") || "all", hook.slack ? "Slack" : "JSON", hook.secret_hint]
      .forEach(function (text, n) {
        var cell = document.createElement("td");
        if (n === 0 || n === 3) {
          var code = document.createElement("code");
          code.textContent = text;
          cell.appendChild(code);
        } else {
          cell.textContent = text;
        }
        row.appendChild(cell);
      });
    var cell = document.createElement("td");
    var button = document.createElement("button");
    button.type = "button";
    button.className = "small danger";
    button.dataset.action = "delete-webhook";
    button.textContent = "Delete";
    cell.appendChild(button);
    row.appendChild(cell);
    tbody.appendChild(row);
  }

  document.getElementById("webhook-rows").addEventListener("click", function (event) {
    var button = event.target.closest("button[data-action=delete-webhook]");
    if (!button) return;
    var row = button.closest("tr");
    UL.confirm({title: "Delete this webhook?", body: "Events stop going to " + row.querySelector("code").textContent + ".",
                confirm: "Delete"}).then(function (ok) {
      if (!ok) return;
      UL.act(button, function () { return UL.api("DELETE", "/api/v1/webhooks/" + row.dataset.webhook); },
             "Webhook deleted.").then(function () { row.remove(); }, function () {});
    });
  });
})();
