"""The product's URLs plus /bench/baseline: one INSERT, the floor a request can't beat."""

from django.db import connection
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from undolog_site.urls import urlpatterns as product_urls


@csrf_exempt
def baseline(request):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_baseline (created) VALUES (now())")
    return JsonResponse({"ok": True}, status=201)


urlpatterns = [path("bench/baseline", baseline), *product_urls]
