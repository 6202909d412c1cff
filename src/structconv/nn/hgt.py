"""placeholder"""
class HGTConv: pass
