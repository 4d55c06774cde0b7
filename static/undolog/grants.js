/* Grants: revoke one (DELETE /api/v1/grants/{id}); the row stays, marked revoked. */
(function () {
  "use strict";
  var UL = window.UL;
  document.getElementById("grant-rows").addEventListener("click", function (event) {
    var button = event.target.closest("button.revoke-grant");
    if (!button) return;
    UL.act(button, function () {
      return UL.api("DELETE", "/api/v1/grants/" + button.dataset.id);
    }, "Grant revoked: its calls wait for a person again.").then(function () {
      var row = button.closest("tr");
      row.querySelector(".grant-state").textContent = "revoked";
      button.remove();
    }, function () {});
  });
})();
