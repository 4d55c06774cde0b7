/* Agents: Resume / Suspend (reviewer), the per-agent and org incident switches, budget
 * limits, new agents and their keys (admin), and a fleet rollback's progress (each agent's page
 * starts one). Everything acts through the API; the server re-renders the cards after. A new
 * key is shown once, outside the re-rendered part. */
(function () {
  "use strict";
  var UL = window.UL;
  var holder = document.getElementById("agents-live");
  var refresh = UL.refresher(holder);

  ["agent.suspended", "agent.resumed", "incident.changed", "budget.exceeded"].forEach(function (kind) {
    UL.on(kind, refresh);
  });
  UL.onConnect(function (reconnected) { if (reconnected) refresh(); });

  function budgetPath(name) {
    return "/api/v1/agents/" + encodeURIComponent(name) + "/budget";
  }

  function keysPath(name) {
    return "/api/v1/agents/" + encodeURIComponent(name) + "/keys";
  }

  function showKey(agent, answer) {
    document.getElementById("new-key-agent").textContent = agent;
    document.getElementById("new-key-value").textContent = answer.key;
    document.getElementById("new-key-grace").textContent = answer.rotated ?
      " The rotated key " + answer.rotated.display + " keeps working until " +
      UL.formatTime(answer.rotated.expires_at) + ", so move the agent to this one before then." : "";
    var panel = document.getElementById("new-key");
    panel.hidden = false;
    panel.scrollIntoView({block: "nearest"});
  }

  var newKey = document.getElementById("new-key");
  if (newKey) {
    document.getElementById("new-key-copy").addEventListener("click", function () {
      var value = document.getElementById("new-key-value").textContent;
      if (navigator.clipboard) navigator.clipboard.writeText(value).then(function () { UL.flash("Key copied.", "ok"); });
    });
    document.getElementById("new-key-done").addEventListener("click", function () {
      document.getElementById("new-key-value").textContent = "";
      newKey.hidden = true;
    });
  }

  var agentForm = document.getElementById("agent-form");
  if (agentForm) {
    agentForm.addEventListener("submit", function (event) {
      event.preventDefault();
      var name = document.getElementById("agent-name").value.trim();
      UL.act(agentForm.querySelector("button"), function () {
        return UL.api("POST", "/api/v1/agents", {name: name});
      }, "Agent " + name + " created; issue it a key.").then(function () {
        agentForm.reset();
        refresh();
      }, function () {});
    });
  }

  function keyAction(button, name, verb) {
    var prefix = button.closest("[data-prefix]").dataset.prefix;
    var rotate = verb === "rotate";
    UL.confirm({
      title: (rotate ? "Rotate" : "Revoke") + " key ul_" + prefix + "_… of " + name + "?",
      body: rotate ? "A new key is issued (shown once). The old one keeps working for a grace period, " +
                     "so the agent can switch without a failed call; then it stops."
                   : "The key stops working now: the agent's next request with it is refused (401).",
      confirm: rotate ? "Rotate" : "Revoke"
    }).then(function (ok) {
      if (!ok) return;
      UL.act(button, function () {
        return UL.api("POST", keysPath(name) + "/" + encodeURIComponent(prefix) + "/" + verb, {});
      }, rotate ? null : "Key ul_" + prefix + "_… revoked.").then(function (answer) {
        if (rotate) showKey(name, answer);
        refresh();
      }, function () {});
    });
  }

  holder.addEventListener("click", function (event) {
    var button = event.target.closest("button");
    if (!button) return;
    var card = button.closest("[data-agent]");
    var name = card && card.dataset.agent;
    if (button.dataset.action === "issue-key") {
      UL.act(button, function () { return UL.api("POST", keysPath(name), {name: "dashboard"}); })
        .then(function (answer) { showKey(name, answer); refresh(); }, function () {});
    } else if (button.dataset.action === "rotate-key" || button.dataset.action === "revoke-key") {
      keyAction(button, name, button.dataset.action === "rotate-key" ? "rotate" : "revoke");
    } else if (button.id === "incident-on") {
      UL.confirm({
        title: "Turn the incident switch on?",
        body: "Every irreversible call of every agent of the organization is refused from its next call on, " +
              "and recorded. Compensable and safe calls go on. It stays on until an admin turns it off.",
        confirm: "Turn it on"
      }).then(function (ok) {
        if (!ok) return;
        UL.act(button, function () { return UL.api("POST", "/api/v1/org/incident", {on: true}); },
               "Incident switch on: irreversible calls are refused.").then(refresh, function () {});
      });
    } else if (button.id === "incident-off") {
      UL.act(button, function () { return UL.api("POST", "/api/v1/org/incident", {on: false}); },
             "Incident switch off: agents' own limits apply again.").then(refresh, function () {});
    } else if (button.dataset.action === "resume") {
      UL.act(button, function () { return UL.api("POST", "/api/v1/agents/" + encodeURIComponent(name) + "/resume", {}); },
             name + " resumed.").then(refresh, function () {});
    } else if (button.dataset.action === "suspend") {
      UL.confirm({title: "Suspend " + name + "?", body: "Its new sessions and calls are refused (423) until someone resumes it.",
                  confirm: "Suspend", input: {label: "Note", required: false}}).then(function (note) {
        if (note === null) return;
        UL.act(button, function () { return UL.api("POST", "/api/v1/agents/" + encodeURIComponent(name) + "/suspend", {note: note}); },
               name + " suspended.").then(refresh, function () {});
      });
    } else if (button.dataset.action === "agent-incident-on") {
      UL.confirm({title: "Stop " + name + "'s irreversible calls?",
                  body: "Sets its limit of irreversible calls per run to 0: from its next call on, every irreversible call is refused.",
                  confirm: "Stop irreversible calls"}).then(function (ok) {
        if (!ok) return;
        UL.act(button, function () { return UL.api("PATCH", budgetPath(name), {max_irreversible_per_run: 0}); },
               name + " may make no irreversible call.").then(refresh, function () {});
      });
    } else if (button.dataset.action === "agent-incident-off") {
      // Back to the cap it had before the switch (the server read it from the budget history).
      var raw = button.dataset.restore || "";
      var cap = raw === "" ? null : parseInt(raw, 10);
      UL.act(button, function () { return UL.api("PATCH", budgetPath(name), {max_irreversible_per_run: cap}); },
             name + "'s irreversible calls are allowed again (" + (cap === null ? "no per-run limit" : cap + " per run") + ").")
        .then(refresh, function () {});
    }
  });

  function rollbackPath(name) {
    return "/api/v1/agents/" + encodeURIComponent(name) + "/rollback";
  }

  /* A fleet rollback is started on the agent's page (the card's "Roll back runs…" links there);
   * a card shows the entries one has left until the walks are done. */
  var watching = {};

  function watch(name) {
    if (watching[name]) return;
    watching[name] = true;
    UL.follow(rollbackPath(name), function (answer) {
      if (!answer) { watching[name] = false; return false; }
      var left = answer.in_progress;
      var line = holder.querySelector('[data-agent="' + CSS.escape(name) + '"] [data-role=rollback-progress]');
      if (line) {
        line.hidden = left.entries_left === 0;
        line.dataset.entriesLeft = left.entries_left;
        line.querySelector("[data-role=rollback-entries]").textContent = left.entries_left;
        line.querySelector("[data-role=rollback-runs]").textContent = left.runs;
      }
      if (left.entries_left > 0) return true;
      watching[name] = false;
      refresh();
      return false;
    });
  }

  // A rollback already under way when the page loads (or started elsewhere): follow it.
  function followRunning() {
    holder.querySelectorAll("[data-role=rollback-progress]").forEach(function (line) {
      if (parseInt(line.dataset.entriesLeft || "0", 10) > 0) watch(line.closest("[data-agent]").dataset.agent);
    });
  }
  followRunning();
  holder.addEventListener("ul:refreshed", followRunning);
  UL.on("agent.rolled_back", refresh);

  holder.addEventListener("submit", function (event) {
    var form = event.target.closest("form.budget-form");
    if (!form) return;
    event.preventDefault();
    var body = {};
    form.querySelectorAll("input[type=number]").forEach(function (input) {
      var raw = input.value.trim();
      body[input.name] = raw === "" ? null : (input.step === "1" ? parseInt(raw, 10) : parseFloat(raw));
    });
    form.querySelectorAll("select").forEach(function (select) { body[select.name] = select.value; });
    UL.act(form.querySelector("button[type=submit]"), function () {
      return UL.api("PATCH", budgetPath(form.dataset.agent), body);
    }, "Limits of " + form.dataset.agent + " saved; they apply from its next call.").then(refresh, function () {});
  });
})();
