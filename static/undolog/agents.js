/* Agents: Resume / Suspend (reviewer), the per-agent and org incident switches and budget
 * limits (admin). Everything acts through the API; the server re-renders the cards after. */
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

  holder.addEventListener("click", function (event) {
    var button = event.target.closest("button");
    if (!button) return;
    var card = button.closest("[data-agent]");
    var name = card && card.dataset.agent;
    if (button.id === "incident-on") {
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
