/*
 * The experiment behind _cyattn_bf16_emul.h (issue 40): what vdpbf16ps does on this CPU.
 * Compares one lane of the instruction with candidate models on 2 M random and adversarial
 * cases (ordinary values, cancellation against the accumulator and between the two products,
 * tiny and subnormal values), then prints single cases (DAZ, FTZ, overflow, NaN, rounding).
 *   gcc -O1 -mavx512f -mavx512bf16 -o /tmp/bf16_probe bench/bf16_dot_probe.c -lm && /tmp/bf16_probe
 * On an AMD EPYC Zen 5 (2026-12-04): seq (odd-index element first, each product exact and
 * rounded once with the add, DAZ, FTZ) 0 mismatches; even first 422929; both products and the
 * accumulator rounded once (fused) 486132; the pair's sum rounded first 822735.
 * tests/test_bf16_fast.py keeps the single cases and compares the instruction with the
 * emulation on every AVX512-BF16 host.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
static float f(uint32_t b){float x; memcpy(&x,&b,4); return x;}
static uint32_t u(float x){uint32_t b; memcpy(&b,&x,4); return b;}
static float bf(uint16_t h){return f((uint32_t)h<<16);}
static float daz_bf(uint16_t h){ if(((h>>7)&0xff)==0) h&=0x8000; return bf(h);}
static float ftz(float x){uint32_t b=u(x); if(((b>>23)&0xff)==0) b&=0x80000000u; return f(b);}
static float daz32(float x){return ftz(x);}
/* hardware: one lane */
static float hw(float acc, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1){
  __m512 c=_mm512_set1_ps(acc);
  uint32_t av=(uint32_t)a0|((uint32_t)a1<<16), bv=(uint32_t)b0|((uint32_t)b1<<16);
  __m512i A=_mm512_set1_epi32(av), B=_mm512_set1_epi32(bv);
  c=_mm512_dpbf16_ps(c,(__m512bh)A,(__m512bh)B);
  float o[16]; _mm512_storeu_ps(o,c); return o[0];
}
/* model SDM: odd first then even, each rounded, daz in, ftz out; flags: accdaz */
static volatile int accdaz=1, ftzmid=1, order_odd_first=1;
static float model_seq(float acc,uint16_t a0,uint16_t a1,uint16_t b0,uint16_t b1){
  double p0=(double)daz_bf(a0)*daz_bf(b0), p1=(double)daz_bf(a1)*daz_bf(b1);
  float s = accdaz? daz32(acc):acc;
  /* exact p in double; float add with single rounding: use fma-like via double? p exact 16 bits, s 24 bits */
  double first = order_odd_first? p1:p0, second = order_odd_first? p0:p1;
  /* single rounding of s+first: compute with long double (64-bit mantissa) */
  long double t=(long double)s+(long double)first; float r=(float)t;
  if(ftzmid) r=ftz(r);
  t=(long double)r+(long double)second; r=(float)t; r=ftz(r);
  return r;
}
static float model_fused(float acc,uint16_t a0,uint16_t a1,uint16_t b0,uint16_t b1){
  double p0=(double)daz_bf(a0)*daz_bf(b0), p1=(double)daz_bf(a1)*daz_bf(b1);
  float s = accdaz? daz32(acc):acc;
  long double t=(long double)s+(long double)p1+(long double)p0; /* may not be exact */
  return ftz((float)t);
}
static float model_pairfirst(float acc,uint16_t a0,uint16_t a1,uint16_t b0,uint16_t b1){
  double p0=(double)daz_bf(a0)*daz_bf(b0), p1=(double)daz_bf(a1)*daz_bf(b1);
  float s = accdaz? daz32(acc):acc;
  float pp=(float)((long double)p0+(long double)p1); pp=ftz(pp);
  return ftz((float)((long double)s+pp));
}
static uint64_t rs=88172645463325252ull; static uint64_t rnd(){rs^=rs<<13;rs^=rs>>7;rs^=rs<<17;return rs;}
static uint16_t rbf(int emin,int emax){ int e=emin+(int)(rnd()%(emax-emin+1)); return (uint16_t)((rnd()&1)<<15 | (e&0xff)<<7 | (rnd()&0x7f)); }
static int same(float x,float y){ return u(x)==u(y) || (isnan(x)&&isnan(y)); }
int main(){
  long n=0, ms=0, mf=0, mp=0;
  for(int trial=0; trial<2000000; trial++){
    int mode=trial%4; uint16_t a0,a1,b0,b1; float acc;
    if(mode==0){a0=rbf(120,134);a1=rbf(120,134);b0=rbf(120,134);b1=rbf(120,134);acc=f((uint32_t)(rnd()&1)<<31|(uint32_t)(115+rnd()%25)<<23|(rnd()&0x7fffff));}
    else if(mode==1){ /* cancellation: p1 ~ -acc */ a0=rbf(110,134);b0=rbf(110,134);a1=rbf(120,134);b1=rbf(120,134); acc=-bf(a1)*bf(b1)*(1+ (float)((int)(rnd()%64)-32)/(1<<20)); }
    else if(mode==2){ /* p0 ~ -p1 */ a1=rbf(120,134);b1=rbf(120,134); a0=a1; b0=b1^0x8000; if(rnd()&1) b0 ^= (rnd()&3); acc=f((uint32_t)(rnd()&1)<<31|(uint32_t)(90+rnd()%40)<<23|(rnd()&0x7fffff));}
    else { /* tiny ranges: subnormal results */ a0=rbf(0,70);a1=rbf(0,70);b0=rbf(0,70);b1=rbf(0,70); acc=f((uint32_t)(rnd()&1)<<31|(uint32_t)(rnd()%4)<<23|(rnd()&0x7fffff)); }
    float h=hw(acc,a0,a1,b0,b1);
    n++; if(!same(h,model_seq(acc,a0,a1,b0,b1))) { if(ms<8) printf("seq mismatch mode %d acc=%a a=%a,%a b=%a,%a hw=%a model=%a\n",mode,acc,bf(a0),bf(a1),bf(b0),bf(b1),h,model_seq(acc,a0,a1,b0,b1)); ms++; }
    if(!same(h,model_fused(acc,a0,a1,b0,b1))) mf++;
    if(!same(h,model_pairfirst(acc,a0,a1,b0,b1))) mp++;
  }
  printf("n=%ld seq(odd first) mismatches=%ld fused=%ld pairfirst=%ld\n",n,ms,mf,mp);
  order_odd_first=0; ms=0; rs=88172645463325252ull;
  for(int trial=0; trial<2000000; trial++){ int mode=trial%3; uint16_t a0,a1,b0,b1; float acc;
    if(mode==0){a0=rbf(120,134);a1=rbf(120,134);b0=rbf(120,134);b1=rbf(120,134);acc=f((uint32_t)(rnd()&1)<<31|(uint32_t)(115+rnd()%25)<<23|(rnd()&0x7fffff));}
    else if(mode==1){ a0=rbf(110,134);b0=rbf(110,134);a1=rbf(120,134);b1=rbf(120,134); acc=-bf(a1)*bf(b1)*(1+ (float)((int)(rnd()%64)-32)/(1<<20)); }
    else { a1=rbf(120,134);b1=rbf(120,134); a0=a1; b0=b1^0x8000; if(rnd()&1) b0 ^= (rnd()&3); acc=f((uint32_t)(rnd()&1)<<31|(uint32_t)(90+rnd()%40)<<23|(rnd()&0x7fffff));}
    if(!same(hw(acc,a0,a1,b0,b1),model_seq(acc,a0,a1,b0,b1))) ms++; }
  printf("seq(even first) mismatches=%ld\n",ms);
  /* specific cases */
  uint16_t one=0x3f80, sub=0x0040, tiny=0x0080 /*2^-126*/, half=0x3f00;
  printf("acc=0, subnormal bf16 * 1: %a\n", hw(0,sub,0,one,0));
  printf("acc=subnormal f32 (0x1p-130), 0 products: %a\n", hw(0x1p-130f,0,0,0,0));
  printf("acc=-subnormal, 0 products: %a\n", hw(-0x1p-130f,0,0,0,0));
  printf("2^-126 * 0.5 (subnormal product), acc 0: %a\n", hw(0,tiny,0,half,0));
  printf("2^-126 * 0.5 + 2^-126*0.5 (two sub products = normal): %a\n", hw(0,tiny,tiny,half,half));
  printf("acc=2^-126, + 2^-126*(-0.5) : %a\n", hw(0x1p-126f,tiny,0,(uint16_t)(half|0x8000),0));
  printf("acc=0x1p-125 + (-0x1p-126*1.5) + 0: %a\n", hw(0x1p-125f,tiny,0,0xbfc0,0));
  printf("acc=-0, products +0: %a ; acc=+0, products -0 (1*-0): %a; acc=-0 + (-0)+(-0): %a\n", hw(-0.0f,0,0,0,0), hw(0.0f,one,0,0x8000,0), hw(-0.0f,one,one,0x8000,0x8000));
  printf("inf*0: %a ; inf + -inf: %a ; nan in: %a (bits %08x)\n", hw(0,0x7f80,0,0,0), hw(0,0x7f80,0x7f80,one,0xbf80), hw(1,0x7fc1,0,one,0), u(hw(1,0x7fc1,0,one,0)));
  printf("snan bf16 0x7f81 * 1: bits %08x; acc snan 0x7f800001: bits %08x; acc nan payload 0x7fc12345: %08x\n", u(hw(0,0x7f81,0,one,0)), u(hw(f(0x7f800001),0,0,0,0)), u(hw(f(0x7fc12345),0,0,0,0)));
  printf("overflow: max*max: %a ; acc=FLT_MAX + 2^127*1.5? %a\n", hw(0,0x7f7f,0,0x7f7f,0), hw(0x1.fffffep127f,0x7f00,0,0x3fc0,0));
  printf("2^254 first, then -2^254: %a\n", hw(0,0xff00,0x7f00,0x7f00,0x7f00));
  printf("product underflow exact? a=2^-100,b=2^-100 acc=1: %a; acc=0:%a\n", hw(1,0x0d80,0,0x0d80,0),hw(0,0x0d80,0,0x0d80,0));
  printf("rounding mode ties: acc=1, p=2^-24 : %a ; acc=1+2^-23, p=2^-24: %a\n", hw(1,0x3380,0,one,0), hw(0x1.000002p0f,0x3380,0,one,0));
  printf("two-step vs fused: acc=1, p1=2^-24, p0=2^-24: %a (seq odd->1+2^-23? no: 1 then 1 ->1 ; fused ->1+2^-23)\n", hw(1,0x3380,0x3380,one,one));
  return 0;
}
