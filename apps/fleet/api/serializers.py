from django.conf import settings
from rest_framework import serializers

from apps.fleet.models import GpuModel


class GpuModelOutput(serializers.ModelSerializer):
    currency = serializers.SerializerMethodField()

    class Meta:
        model = GpuModel
        fields = ["name", "display_name", "memory_mib", "hourly_price", "currency"]

    def get_currency(self, obj: GpuModel) -> str:
        return str(settings.PORTAL_CURRENCY)
