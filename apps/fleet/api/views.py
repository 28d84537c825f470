from apps.core.api.base import ScopedListAPIView
from apps.fleet.api.serializers import GpuModelOutput
from apps.fleet.models import GpuModel


class GpuModelListView(ScopedListAPIView):
    """GPU models with memory, hourly price and the installation's currency."""

    model = GpuModel
    serializer_class = GpuModelOutput
