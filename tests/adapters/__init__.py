"""The adapters against their real SDKs, through each SDK's own mock transport or test model."""
