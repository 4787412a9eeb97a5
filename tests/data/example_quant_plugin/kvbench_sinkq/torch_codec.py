"""SinkQ on torch: kvbench's intq codec at 4 bits per token; the rest is CodecMethod's."""
from kvbench.kernels.formats import IntQFormat
from kvbench.methods.core.codec_cache import CodecMethod
from kvbench.methods.settings import implements
from kvbench.methods.torch.intq import IntQCodec

from kvbench_sinkq import SinkQ


@implements(SinkQ)
class TorchSinkQ(CodecMethod):
    def codec(self):
        # any kvbench.methods.core.contracts.Codec: encode, decode, nbytes of every stored byte
        return IntQCodec(IntQFormat(bits=4, group_size=self.settings.group_size, axis="token"))
